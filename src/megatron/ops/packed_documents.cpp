// Packed documents' cumulative lengths (AttentionParams::cu_seqlens, ops/attention.h): their
// derivation from contiguous segment ids and the rules their values keep, on the host.
#include <algorithm>
#include <unordered_set>
#include <vector>

#include "megatron/ops/attention.h"
#include "megatron/ops/checks/common.h"
#include "megatron/ops/cpu/dispatch_dtype.h"

namespace megatron::ops {

using checks::check_defined;
using cpu::check_cpu;

Tensor packed_cu_seqlens(const Tensor& segment_ids) {
  check_defined(segment_ids, "packed_cu_seqlens segment_ids");
  check_cpu(segment_ids, "packed_cu_seqlens segment_ids");
  check_dtype(segment_ids, DType::i32, "packed_cu_seqlens segment_ids");
  MEGATRON_CHECK(segment_ids.ndim() == 2,
                 "packed_cu_seqlens: segment_ids must be (B,S), got " << shape_str(segment_ids.shape()));
  const int64_t B = segment_ids.dim(0), S = segment_ids.dim(1);
  MEGATRON_CHECK(B * S < (int64_t(1) << 31), "packed_cu_seqlens: " << B << " x " << S << " positions exceed int32");
  const int32_t* ids = segment_ids.data<int32_t>();
  std::vector<int32_t> cu = {0};
  for (int64_t b = 0; b < B; ++b) {
    std::unordered_set<int32_t> ended;  // ids of this row's documents before the current one
    for (int64_t s = 1; s < S; ++s) {
      const int32_t id = ids[b * S + s], previous = ids[b * S + s - 1];
      if (id == previous) continue;
      ended.insert(previous);
      MEGATRON_CHECK(!ended.contains(id), "packed_cu_seqlens: segment id " << id << " at row " << b << ", position "
                                                                           << s << " reappears after another "
                                                                           << "document; packed documents are "
                                                                           << "contiguous runs (use segment_ids)");
      cu.push_back(int32_t(b * S + s));
    }
    cu.push_back(int32_t((b + 1) * S));
  }
  Tensor out = Tensor::empty({int64_t(cu.size())}, DType::i32);
  std::copy(cu.begin(), cu.end(), out.data<int32_t>());
  return out;
}

void check_cu_seqlens(const Tensor& cu_seqlens, int64_t B, int64_t S, int64_t max_seqlen) {
  check_defined(cu_seqlens, "attention cu_seqlens");
  check_cpu(cu_seqlens, "attention cu_seqlens");
  check_dtype(cu_seqlens, DType::i32, "attention cu_seqlens");
  MEGATRON_CHECK(cu_seqlens.ndim() == 1 && cu_seqlens.dim(0) >= 2,
                 "attention cu_seqlens must be (N+1) for N >= 1 documents, got " << shape_str(cu_seqlens.shape()));
  const int32_t* cu = cu_seqlens.data<int32_t>();
  const int64_t n = cu_seqlens.dim(0);
  MEGATRON_CHECK(cu[0] == 0 && cu[n - 1] == B * S, "attention cu_seqlens run from " << cu[0] << " to " << cu[n - 1]
                                                                                    << "; they must run from 0 to B*S = "
                                                                                    << B * S);
  int64_t next_row_start = S;
  for (int64_t d = 1; d < n; ++d) {
    MEGATRON_CHECK(cu[d] >= cu[d - 1], "attention cu_seqlens[" << d << "] = " << cu[d] << " is below cu_seqlens["
                                                               << d - 1 << "] = " << cu[d - 1]
                                                               << "; cumulative lengths never decrease");
    MEGATRON_CHECK(cu[d] <= next_row_start, "attention cu_seqlens: the document [" << cu[d - 1] << ", " << cu[d]
                                                                                   << ") crosses the row start "
                                                                                   << next_row_start << " (S = " << S
                                                                                   << "); end a document at every "
                                                                                   << "row start");
    MEGATRON_CHECK(max_seqlen == 0 || cu[d] - cu[d - 1] <= max_seqlen,
                   "attention cu_seqlens: the document [" << cu[d - 1] << ", " << cu[d]
                                                          << ") is longer than max_seqlen = " << max_seqlen
                                                          << "; pass the longest document's length "
                                                          << "(longest_document) or 0");
    if (cu[d] == next_row_start) next_row_start += S;
  }
}

int64_t longest_document(const Tensor& cu_seqlens) {
  check_defined(cu_seqlens, "longest_document cu_seqlens");
  check_cpu(cu_seqlens, "longest_document cu_seqlens");
  check_dtype(cu_seqlens, DType::i32, "longest_document cu_seqlens");
  const int32_t* cu = cu_seqlens.data<int32_t>();
  int64_t longest = 0;
  for (int64_t d = 1; d < cu_seqlens.numel(); ++d) longest = std::max<int64_t>(longest, cu[d] - cu[d - 1]);
  return longest;
}

}  // namespace megatron::ops
