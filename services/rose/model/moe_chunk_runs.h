#pragma once
// [TAG_MOE_LT_BF16] How a step's rows are cut into MoE calls when the ops want large prefill
// chunks on their own (LlmOps::moeChunkMinRowsPerExpert > 0): every sequence whose chunk has at
// least `min_rows` rows per expert on average (tokens x top_k >= min_rows x experts) is one run
// marked `large`; the other rows, adjacent sequences merged, are runs of their own. A row then
// shares its MoE call with its own chunk only (large) or with rows whose path never depends on the
// call's size (the tiled kernels), so its bits do not depend on what else is in the step.

#include <cstdint>
#include <span>
#include <vector>

namespace garden::rose {

struct MoeRun {
  int64_t begin = 0, end = 0;  // rows [begin, end)
  bool large = false;
};

// cu: the step's sequence row offsets (size sequences + 1, cu[0] == 0, non-decreasing); rows past
// cu.back() up to `rows` (padding) join the last run that is not large. Leaves `out` empty when no
// chunk is large (one call for the whole step).
inline void moeChunkRuns(std::span<const int32_t> cu, int64_t rows, int64_t top_k, int64_t experts,
                         int64_t min_rows, std::vector<MoeRun>& out) {
  out.clear();
  if (cu.size() < 2 || min_rows <= 0) return;
  bool any = false;
  for (size_t s = 0; s + 1 < cu.size(); ++s) {
    any = any || static_cast<int64_t>(cu[s + 1] - cu[s]) * top_k >= min_rows * experts;
  }
  if (!any) return;
  for (size_t s = 0; s + 1 < cu.size(); ++s) {
    const int64_t b = cu[s], e = cu[s + 1];
    if (e == b) continue;
    const bool large = (e - b) * top_k >= min_rows * experts;
    if (!large && !out.empty() && !out.back().large && out.back().end == b) {
      out.back().end = e;
    } else {
      out.push_back(MoeRun{b, e, large});
    }
  }
  const int64_t last = cu.back();
  if (rows > last) {
    if (!out.empty() && !out.back().large && out.back().end == last) {
      out.back().end = rows;
    } else {
      out.push_back(MoeRun{last, rows, false});
    }
  }
}

// [TAG_MOE_PREFILL_AUTO] The whole step as one run (rows including padding), large when its
// `real_rows` have at least `min_rows` rows per expert on average.
inline void moeWholeStepRun(int64_t rows, int64_t real_rows, int64_t top_k, int64_t experts,
                            int64_t min_rows, std::vector<MoeRun>& out) {
  out.clear();
  if (rows <= 0) return;
  out.push_back(MoeRun{0, rows, min_rows > 0 && real_rows * top_k >= min_rows * experts});
}

}  // namespace garden::rose
