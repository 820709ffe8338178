#pragma once
// Pre-tokenization: cutting UTF-8 text into the pieces that BPE then encodes one by one, with
// the split regexes of GPT-2 and LLaMA-3 (interop-formats.md 5.3) or any pattern a
// tokenizer.json names. Patterns run on PCRE2 in UTF + UCP mode, so \p{L} and \p{N} are the
// Unicode categories (PCRE2's Unicode tables; Debian bookworm ships Unicode 14).
//
// \s and \S are rewritten to the Unicode White_Space property before compiling, which is what
// Oniguruma (Hugging Face tokenizers) and fancy-regex (tiktoken) match: PCRE2's own \s also
// takes U+180E. JavaScript's \s differs from all of them (it takes U+FEFF, not U+0085).
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace megatron::datasets {

// GPT-2's split regex, also the ByteLevel pre-tokenizer's with use_regex.
inline constexpr const char* kGpt2SplitPattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// Throws an Error naming the byte offset of the first invalid sequence (overlong forms,
// surrogates and code points past U+10FFFF included). `what` names the input in the message.
void check_utf8(std::string_view text, std::string_view what);

// True for the code points of the Unicode White_Space property (the \s of the patterns).
bool is_unicode_white_space(char32_t c);

// How the matches of a Split pre-tokenizer become pieces (tokenizers' SplitDelimiterBehavior).
enum class SplitBehavior {
  removed,               // matches are dropped, the text between them kept
  isolated,              // matches and the text between them are separate pieces
  merged_with_previous,  // a match is appended to the piece before it
  merged_with_next,      // a match is prepended to the piece after it
  contiguous,            // consecutive matches form one piece
};

// Parses a tokenizer.json behavior name ("Isolated", ...); throws listing the valid names.
SplitBehavior parse_split_behavior(const std::string& name);

// A compiled pattern with its behavior. Immutable after construction, so one instance may split
// on many threads at once. The input must be valid UTF-8 (check_utf8 first).
class RegexSplitter {
 public:
  // invert: the pattern matches the pieces to keep rather than the delimiters.
  RegexSplitter(const std::string& pattern, SplitBehavior behavior, bool invert);
  ~RegexSplitter();
  RegexSplitter(RegexSplitter&&) noexcept;
  RegexSplitter& operator=(RegexSplitter&&) noexcept;

  // Appends the non-empty pieces of text, in order, as views into text.
  void split(std::string_view text, std::vector<std::string_view>& pieces) const;

 private:
  struct Compiled;
  std::unique_ptr<Compiled> compiled_;
  SplitBehavior behavior_;
  bool invert_;
};

}  // namespace megatron::datasets
