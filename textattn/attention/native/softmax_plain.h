// softmax_attention.cc's layout ([batch, length, heads, head_dim] operands, [batch, heads,
// length] log-sum-exps) and its plain path: one query row at a time, for a head_dim the
// register-blocked path (softmax_attention.cc) has no tiles for. Same semantics and residuals.
#ifndef TEXTATTN_NATIVE_SOFTMAX_PLAIN_H_
#define TEXTATTN_NATIVE_SOFTMAX_PLAIN_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "vec8.h"

namespace textattn {

struct Shape {
  int64_t batch, length, heads, dim;
  int64_t row() const { return heads * dim; }  // stride between tokens in [B, L, H, D]
  int64_t at(int64_t b, int64_t i, int64_t h) const { return ((b * length + i) * heads + h) * dim; }
  int64_t lse_at(int64_t b, int64_t h) const { return (b * heads + h) * length; }
};

// The scores of query row i (scaled, padding keys at -inf) into row[0, limit), and their max.
template <int kDim>
float score_row(const Shape& s, int64_t D, float scale, const float* qi, const float* kt,
                const float* bias, int64_t limit, float* row) {
  const int64_t L = s.length;
  for (int64_t j = 0; j < limit; ++j) row[j] = 0.0f;
  for (int64_t d = 0; d < D; ++d) {
    const float qd = qi[d] * scale;
    const float* kr = kt + d * L;
    for (int64_t j = 0; j < limit; ++j) row[j] += qd * kr[j];
  }
  float mx = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < limit; ++j) {
    row[j] += bias[j];
    mx = std::max(mx, row[j]);
  }
  return mx;
}

// K transposed ([D, L]) and the padding bias (0 or -inf, so the max and the sum are plain
// reductions the compiler can vectorise) of one (batch, head) pair.
inline void transpose_keys(const Shape& s, int64_t b, int64_t h, int64_t D, const float* k,
                           const int32_t* mask, std::vector<float>& kt, std::vector<float>& bias) {
  const int64_t L = s.length;
  kt.resize(D * L);
  bias.resize(L);
  for (int64_t j = 0; j < L; ++j) {
    const float* kj = k + s.at(b, j, h);
    for (int64_t d = 0; d < D; ++d) kt[d * L + j] = kj[d];
    bias[j] = mask[b * L + j] ? 0.0f : -std::numeric_limits<float>::infinity();
  }
}

// D > 0: head_dim known at compile time (the common sizes), so the inner loops unroll.
template <int kDim>
void forward_pair(const Shape& s, int64_t b, int64_t h, bool causal, const float* q,
                  const float* k, const float* v, const int32_t* mask, float* out, float* lse,
                  std::vector<float>& kt, std::vector<float>& bias, std::vector<float>& row) {
  const int64_t L = s.length, D = kDim > 0 ? kDim : s.dim;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const float inf = std::numeric_limits<float>::infinity();
  transpose_keys(s, b, h, D, k, mask, kt, bias);
  row.resize(L);
  float* lb = lse + s.lse_at(b, h);
  for (int64_t i = 0; i < L; ++i) {
    const int64_t limit = causal ? i + 1 : L;
    float* oi = out + s.at(b, i, h);
    const float mx = score_row<kDim>(s, D, scale, q + s.at(b, i, h), kt.data(), bias.data(),
                                     limit, row.data());
    for (int64_t d = 0; d < D; ++d) oi[d] = 0.0f;
    if (mx == -inf) {  // no visible key: zero weights, zero output
      lb[i] = inf;
      continue;
    }
    float total = 0.0f;
    for (int64_t j = 0; j < limit; ++j) {
      row[j] = bias[j] == 0.0f ? exp_nonpositive(row[j] - mx) : 0.0f;
      total += row[j];
    }
    lb[i] = mx + std::log(total);
    const float inv = 1.0f / total;
    float acc[kDim > 0 ? kDim : 1024];
    for (int64_t d = 0; d < D; ++d) acc[d] = 0.0f;
    for (int64_t j = 0; j < limit; ++j) {
      const float p = row[j] * inv;
      const float* vj = v + s.at(b, j, h);
      for (int64_t d = 0; d < D; ++d) acc[d] += p * vj[d];
    }
    for (int64_t d = 0; d < D; ++d) oi[d] = acc[d];
  }
}

template <int kDim>
void backward_pair(const Shape& s, int64_t b, int64_t h, bool causal, const float* q,
                   const float* k, const float* v, const int32_t* mask, const float* out,
                   const float* lse, const float* d_out, float* d_q, float* d_k, float* d_v,
                   std::vector<float>& kt, std::vector<float>& bias,
                   std::vector<float>& scratch) {
  const int64_t L = s.length, D = kDim > 0 ? kDim : s.dim;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const float inf = std::numeric_limits<float>::infinity();
  transpose_keys(s, b, h, D, k, mask, kt, bias);
  scratch.assign(3 * D * L + 2 * L, 0.0f);
  float* vt = scratch.data();          // V transposed, [D, L]
  float* dk = vt + D * L;              // dK accumulator, [L, D]
  float* dv = dk + D * L;              // dV accumulator, [L, D]
  float* ds = dv + D * L;              // one row of dS, [L]
  float* p = ds + L;                   // one row of weights, [L]
  for (int64_t j = 0; j < L; ++j) {
    const float* vj = v + s.at(b, j, h);
    for (int64_t d = 0; d < D; ++d) vt[d * L + j] = vj[d];
  }
  const float* lb = lse + s.lse_at(b, h);
  for (int64_t i = 0; i < L; ++i) {
    const int64_t limit = causal ? i + 1 : L;
    const float* doi = d_out + s.at(b, i, h);
    const float* oi = out + s.at(b, i, h);
    const float* qi = q + s.at(b, i, h);
    float* dqi = d_q + s.at(b, i, h);
    if (lb[i] == inf) {  // no visible key: no weights, no gradient
      for (int64_t d = 0; d < D; ++d) dqi[d] = 0.0f;
      continue;
    }
    // The forward's weights, recomputed: P_ij = exp(s_ij - lse_i)
    score_row<kDim>(s, D, scale, qi, kt.data(), bias.data(), limit, p);
    for (int64_t j = 0; j < limit; ++j)
      p[j] = bias[j] == 0.0f ? exp_nonpositive(std::min(p[j] - lb[i], 0.0f)) : 0.0f;
    float delta = 0.0f;  // sum_j P_ij dP_ij = dO_i . O_i
    for (int64_t d = 0; d < D; ++d) delta += doi[d] * oi[d];
    // dV_j += P_ij dO_i
    for (int64_t j = 0; j < limit; ++j) {
      const float pij = p[j];
      float* dvj = dv + j * D;
      for (int64_t d = 0; d < D; ++d) dvj[d] += pij * doi[d];
    }
    // dP_ij = dO_i . V_j, then dS_ij = P_ij (dP_ij - delta) * scale
    for (int64_t j = 0; j < limit; ++j) ds[j] = 0.0f;
    for (int64_t d = 0; d < D; ++d) {
      const float g = doi[d];
      const float* vr = vt + d * L;
      for (int64_t j = 0; j < limit; ++j) ds[j] += g * vr[j];
    }
    for (int64_t j = 0; j < limit; ++j) ds[j] = p[j] * (ds[j] - delta) * scale;
    // dQ_i = sum_j dS_ij K_j ; dK_j += dS_ij Q_i
    float acc[kDim > 0 ? kDim : 1024];
    for (int64_t d = 0; d < D; ++d) acc[d] = 0.0f;
    for (int64_t j = 0; j < limit; ++j) {
      const float g = ds[j];
      const float* kj = k + s.at(b, j, h);
      float* dkj = dk + j * D;
      for (int64_t d = 0; d < D; ++d) {
        acc[d] += g * kj[d];
        dkj[d] += g * qi[d];
      }
    }
    for (int64_t d = 0; d < D; ++d) dqi[d] = acc[d];
  }
  for (int64_t j = 0; j < L; ++j) {
    float* dkj = d_k + s.at(b, j, h);
    float* dvj = d_v + s.at(b, j, h);
    for (int64_t d = 0; d < D; ++d) {
      dkj[d] = dk[j * D + d];
      dvj[d] = dv[j * D + d];
    }
  }
}

}  // namespace textattn

#endif  // TEXTATTN_NATIVE_SOFTMAX_PLAIN_H_
