#include "megatron/datasets/tokenizers/pretokenize.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "megatron/core/error.h"

namespace megatron::datasets {

namespace {

// The White_Space property as a PCRE2 class body: Zs, Zl, Zp plus the C0 controls 9-13 and NEL.
// VT is written \x{0B} because PCRE2's \v means "any vertical space".
constexpr const char* kWhiteSpaceClassBody = R"(\t\n\x{0B}\f\r\x{85}\p{Z})";

std::string hex_byte(unsigned char b) {
  const char* digits = "0123456789ABCDEF";
  return std::string("0x") + digits[b >> 4] + digits[b & 15];
}

// Replaces \s and \S by White_Space classes, leaving every other escape and class untouched.
std::string rewrite_white_space(const std::string& pattern) {
  std::string out;
  bool in_class = false;
  for (size_t k = 0; k < pattern.size(); ++k) {
    const char c = pattern[k];
    if (c == '\\' && k + 1 < pattern.size()) {
      const char e = pattern[++k];
      if (e == 's') {
        out += in_class ? std::string(kWhiteSpaceClassBody) : std::string("[") + kWhiteSpaceClassBody + "]";
      } else if (e == 'S') {
        MEGATRON_CHECK(!in_class, "split pattern '" << pattern << "' uses \\S inside a character class, which this "
                                                    << "tokenizer cannot rewrite to Unicode White_Space; write "
                                                    << "it as a negated class");
        out += std::string("[^") + kWhiteSpaceClassBody + "]";
      } else {
        out += c;
        out += e;
      }
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      // A ']' right after '[' or '[^' is a literal member, not the end of the class.
      if (k + 1 < pattern.size() && pattern[k + 1] == '^') out += pattern[++k];
      if (k + 1 < pattern.size() && pattern[k + 1] == ']') out += pattern[++k];
      continue;
    }
    if (in_class && c == '[' && k + 1 < pattern.size() && pattern[k + 1] == ':') {
      const size_t end = pattern.find(":]", k + 2);  // a POSIX class such as [:alpha:] inside [...]
      if (end != std::string::npos) {
        out.append(pattern, k, end + 2 - k);
        k = end + 1;
        continue;
      }
    }
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

struct MatchDataDeleter {
  void operator()(pcre2_match_data* md) const { pcre2_match_data_free(md); }
};

// One match block per thread: splitters are shared between threads and only the whole-match
// offsets are read, so a one-pair block serves every pattern.
pcre2_match_data* thread_match_data() {
  thread_local std::unique_ptr<pcre2_match_data, MatchDataDeleter> md(pcre2_match_data_create(1, nullptr));
  MEGATRON_CHECK(md != nullptr, "out of memory allocating a PCRE2 match block");
  return md.get();
}

// Length of the UTF-8 sequence starting with lead byte b (input is already validated).
size_t utf8_length(unsigned char b) { return b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4; }

}  // namespace

void check_utf8(std::string_view text, std::string_view what) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  size_t k = 0;
  while (k < n) {
    const unsigned char b = s[k];
    if (b < 0x80) {
      ++k;
      continue;
    }
    size_t len = 0;
    char32_t min = 0;
    char32_t c = 0;
    if (b >= 0xC2 && b <= 0xDF) {
      len = 2, min = 0x80, c = b & 0x1F;
    } else if (b >= 0xE0 && b <= 0xEF) {
      len = 3, min = 0x800, c = b & 0x0F;
    } else if (b >= 0xF0 && b <= 0xF4) {
      len = 4, min = 0x10000, c = b & 0x07;
    }
    bool ok = len != 0 && k + len <= n;
    for (size_t j = 1; ok && j < len; ++j) {
      ok = (s[k + j] & 0xC0) == 0x80;
      c = (c << 6) | (s[k + j] & 0x3F);
    }
    ok = ok && c >= min && c <= 0x10FFFF && !(c >= 0xD800 && c <= 0xDFFF);
    MEGATRON_CHECK(ok, what << " is not valid UTF-8: byte " << hex_byte(b) << " at offset " << k
                            << " does not start a well-formed sequence; tokenizers take UTF-8 text (re-encode "
                            << "the input, e.g. with iconv -f <its encoding> -t UTF-8)");
    k += len;
  }
}

bool is_unicode_white_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

SplitBehavior parse_split_behavior(const std::string& name) {
  if (name == "Removed") return SplitBehavior::removed;
  if (name == "Isolated") return SplitBehavior::isolated;
  if (name == "MergedWithPrevious") return SplitBehavior::merged_with_previous;
  if (name == "MergedWithNext") return SplitBehavior::merged_with_next;
  if (name == "Contiguous") return SplitBehavior::contiguous;
  MEGATRON_FAIL("unknown Split behavior '" << name
                                           << "'; expected Removed, Isolated, MergedWithPrevious, MergedWithNext "
                                           << "or Contiguous");
}

struct RegexSplitter::Compiled {
  pcre2_code* code = nullptr;
  ~Compiled() { pcre2_code_free(code); }
};

RegexSplitter::RegexSplitter(const std::string& pattern, SplitBehavior behavior, bool invert)
    : compiled_(std::make_unique<Compiled>()), behavior_(behavior), invert_(invert) {
  const std::string rewritten = rewrite_white_space(pattern);
  int error = 0;
  PCRE2_SIZE offset = 0;
  compiled_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(rewritten.data()), rewritten.size(),
                                  PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
  if (compiled_->code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    MEGATRON_FAIL("split pattern '" << pattern << "' does not compile (PCRE2 with UTF and UCP): "
                                    << reinterpret_cast<const char*>(message) << " at offset " << offset);
  }
  // Without JIT (an exotic build or pattern) pcre2_match interprets the pattern: slower, same result.
  pcre2_jit_compile(compiled_->code, PCRE2_JIT_COMPLETE);
}

RegexSplitter::~RegexSplitter() = default;
RegexSplitter::RegexSplitter(RegexSplitter&&) noexcept = default;
RegexSplitter& RegexSplitter::operator=(RegexSplitter&&) noexcept = default;

void RegexSplitter::split(std::string_view text, std::vector<std::string_view>& pieces) const {
  pcre2_match_data* md = thread_match_data();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  // Segments cover the text in order; `delimiter` marks the parts the behavior acts on.
  // isolated and removed (the common cases) emit as they go; the merging behaviors collect first.
  struct Segment {
    size_t begin, end;
    bool delimiter;
  };
  const auto emit = [&](size_t begin, size_t end) { pieces.push_back(text.substr(begin, end - begin)); };
  std::vector<Segment> segments;
  const auto on_segment = [&](size_t begin, size_t end, bool delimiter) {
    if (behavior_ == SplitBehavior::isolated) {
      emit(begin, end);
    } else if (behavior_ == SplitBehavior::removed) {
      if (!delimiter) emit(begin, end);
    } else {
      segments.push_back({begin, end, delimiter});
    }
  };
  size_t pos = 0;
  size_t gap_begin = 0;
  while (pos < text.size()) {
    const int rc = pcre2_match(compiled_->code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK, md, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    MEGATRON_CHECK(rc >= 0, "PCRE2 matching failed with error code " << rc << " at offset " << pos << " of a "
                                                                     << text.size() << "-byte piece");
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    const size_t begin = ov[0], end = ov[1];
    if (end == begin) {  // an empty match cuts nothing: step over one character
      pos = begin + utf8_length(static_cast<unsigned char>(text[begin]));
      continue;
    }
    if (begin > gap_begin) on_segment(gap_begin, begin, invert_);
    on_segment(begin, end, !invert_);
    gap_begin = pos = end;
  }
  if (gap_begin < text.size()) on_segment(gap_begin, text.size(), invert_);

  switch (behavior_) {
    case SplitBehavior::removed:
    case SplitBehavior::isolated:
      break;  // already emitted
    case SplitBehavior::merged_with_previous: {
      std::vector<Segment> merged;
      for (const Segment& s : segments) {
        if (s.delimiter && !merged.empty() && !merged.back().delimiter) {
          merged.back().end = s.end;
          merged.back().delimiter = true;
        } else {
          merged.push_back(s);
        }
      }
      for (const Segment& s : merged) emit(s.begin, s.end);
      break;
    }
    case SplitBehavior::merged_with_next: {
      std::vector<Segment> merged;  // built back to front
      for (auto it = segments.rbegin(); it != segments.rend(); ++it) {
        if (it->delimiter && !merged.empty() && !merged.back().delimiter) {
          merged.back().begin = it->begin;
          merged.back().delimiter = true;
        } else {
          merged.push_back(*it);
        }
      }
      for (auto it = merged.rbegin(); it != merged.rend(); ++it) emit(it->begin, it->end);
      break;
    }
    case SplitBehavior::contiguous: {
      std::vector<Segment> merged;
      for (const Segment& s : segments) {
        if (s.delimiter && !merged.empty() && merged.back().delimiter) {
          merged.back().end = s.end;
        } else {
          merged.push_back(s);
        }
      }
      for (const Segment& s : merged) emit(s.begin, s.end);
      break;
    }
  }
}

}  // namespace megatron::datasets
