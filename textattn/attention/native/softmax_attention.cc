// Exact softmax self-attention for CPUs, forward and backward, as XLA FFI custom calls.
//
// Built on first use by textattn/native.py (the system C++ compiler, -O3 -march=native) and
// called from jax.jit through jax.ffi.ffi_call; textattn.attention.native_softmax_attention is
// the JAX side (custom VJP, fallbacks). Layouts are the model's own, so no transposes are
// needed around the call:
//
//   q, k, v, out, d_out, d_q, d_k, d_v : float32 [batch, length, heads, head_dim]
//   mask                               : int32   [batch, length], non-zero = real token
//   lse (residual for the backward)    : float32 [batch, heads, length], each query row's
//                                        log-sum-exp of its scores (+inf: no visible key)
//
// Semantics are those of textattn.attention.softmax_attention: scores q.k / sqrt(head_dim);
// padding keys (and, when causal, keys after the query) get no weight; a query with no visible
// key at all outputs exactly zero and receives zero gradient. Every (batch, head) pair is
// independent, so the pairs are split over up to `threads` workers (XLA's intra-op thread pool
// or std::threads of our own, parallel.h); the result does not depend on the workers (each
// pair is always computed by one worker in one order).
//
// Why by hand: XLA:CPU runs the four L x L products of this model (head_dim 16) as skinny
// batched matmuls at a fraction of the machine's speed and materialises the scores several
// times (experiments/RESULTS.md, "Training speed"); here a block of query rows is scored,
// exponentiated and applied to V in a small scratch buffer, and only each row's log-sum-exp is
// written out: the backward recomputes the weights from it (flash attention's way), which costs
// one more Q K^T product but saves writing and reading back [batch, heads, L, L] weights (and
// the page faults of a fresh buffer that size every step), and keeps the memory linear in L.

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <cstdint>
#include <cstring>
#include <exception>
#include <limits>
#include <string>
#include <vector>

#include "parallel.h"
#include "softmax_plain.h"
#include "vec8.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

using namespace textattn;  // NOLINT: Shape, the plain path (softmax_plain.h), v8 (vec8.h)

template <typename Body>
void for_each_pair(const Shape& s, textattn::Workers workers, Body body) {
  textattn::for_each_task(s.batch * s.heads, workers, [&](int64_t, int64_t pair) {
    body(pair / s.heads, pair % s.heads);
  });
}

// ---------------------------------------------------------------------------------------------
// Register-blocked versions for head_dim 8, 16, 32 or 64 (other sizes take softmax_plain.h's
// loops, without the skipping of padding blocks and zero-gradient rows): R query rows at a
// time, 8 keys per vector (vec8.h), so every loaded key/value vector feeds R multiply-adds and
// the row accumulators stay in registers. Keys go kKeyLanes to a vector (vec8.h: 16 on AVX-512F,
// else 8), head dimensions 8 to a vector.

// Tile sizes for the vector registers there are: AVX-512 (used here with 256-bit vectors, via
// AVX512VL) has 32, AVX2 and NEON's pairs 16. kChains: independent accumulators of a Q K^T
// tile (each a chain of dependent multiply-adds; fewer than FMA latency x FMA units leave the
// units idle). rows_per_block: query rows a block processes together, so every key/value
// vector loaded serves that many rows (kRowVectors / (head_dim / 8)). Timed on a Zen 4 (CPU-5,
// 2 cores, [32, 256, 12, 32]): 12 chains and 16 row vectors against 8 and 8: forward 36 -> 33
// ms, backward 84 -> 72 ms.
#if defined(__AVX512VL__)
constexpr int kChains = 12;
constexpr int kRowVectors = 16;
#else
constexpr int kChains = 8;
constexpr int kRowVectors = 8;
#endif
constexpr int rows_per_block(int dv) { return dv >= kRowVectors ? 1 : kRowVectors / dv; }
struct Scratch {
  std::vector<float> a, b, c, d, e, f, g, h;
};

// The three products of the blocked kernels, for R rows at once (DV = kDim / 8 vectors a row).
// acc[r][c] += a[r] . t[:, j0 + 8c : j0 + 8c + 8] for C blocks of 8 keys: t is [kDim, Lp] (keys
// contiguous). R * C independent accumulators: each is a chain of kDim dependent multiply-adds,
// so fewer than ~8 chains (FMA latency x FMA units) would leave the units idle.
template <int kDim, int R, int C>
inline void add_row_dots(const float (&a)[R][kDim], const float* t, int64_t Lp, int64_t j0,
                         vk (&acc)[R][C]) {
  for (int d = 0; d < kDim; ++d) {
    vk tv[C];
    for (int c = 0; c < C; ++c) tv[c] = loadk(t + d * Lp + j0 + kKeyLanes * c);
    for (int r = 0; r < R; ++r) {
      const vk ar = splatk(a[r][d]);
      for (int c = 0; c < C; ++c) acc[r][c] += ar * tv[c];
    }
  }
}

// For every kKeyLanes-key block j0 in [begin, end) (multiples of kKeyLanes): acc[r] = init(j0) + a[r] . t[:, j0..]
// and then finish(r, j0, acc[r]); blocks go kWide at a time (R * kWide ~ kChains), then singly.
template <int kDim, int R, typename Init, typename Finish>
inline void row_dots(const float (&a)[R][kDim], const float* t, int64_t Lp, int64_t begin,
                     int64_t end, Init init, Finish finish) {
  constexpr int kWide = R >= kChains ? 1 : kChains / R;
  int64_t j0 = begin;
  for (; j0 + kKeyLanes * kWide <= end; j0 += kKeyLanes * kWide) {
    vk acc[R][kWide];
    for (int c = 0; c < kWide; ++c) {
      const vk x = init(j0 + kKeyLanes * c);
      for (int r = 0; r < R; ++r) acc[r][c] = x;
    }
    add_row_dots<kDim, R, kWide>(a, t, Lp, j0, acc);
    for (int c = 0; c < kWide; ++c)
      for (int r = 0; r < R; ++r) finish(r, j0 + kKeyLanes * c, acc[r][c]);
  }
  for (; j0 < end; j0 += kKeyLanes) {
    vk acc[R][1];
    const vk x = init(j0);
    for (int r = 0; r < R; ++r) acc[r][0] = x;
    add_row_dots<kDim, R, 1>(a, t, Lp, j0, acc);
    for (int r = 0; r < R; ++r) finish(r, j0, acc[r][0]);
  }
}

// out[r] = sum_j w[r * Lp + j] rows[j] over j in [begin, end): rows is [Lp, kDim].
template <int kDim, int R>
inline void weighted_row_sums(const float* w, int64_t Lp, const float* rows, int64_t begin,
                              int64_t end, v8 (&out)[R][kDim / 8]) {
  constexpr int DV = kDim / 8;
  for (int r = 0; r < R; ++r)
    for (int dv = 0; dv < DV; ++dv) out[r][dv] = splat(0.0f);
  for (int64_t j = begin; j < end; ++j) {
    v8 x[DV];
    for (int dv = 0; dv < DV; ++dv) x[dv] = load8(rows + j * kDim + 8 * dv);
    for (int r = 0; r < R; ++r) {
      const float wj = w[r * Lp + j];
      for (int dv = 0; dv < DV; ++dv) out[r][dv] += wj * x[dv];
    }
  }
}

// acc[j] += sum_r w[r * Lp + j] x[r] over j in [begin, end): acc is [Lp, kDim].
template <int kDim, int R>
inline void add_weighted_to_rows(const float* w, int64_t Lp, const float (&x)[R][kDim],
                                 int64_t begin, int64_t end, float* acc) {
  constexpr int DV = kDim / 8;
  v8 g[R][DV];
  for (int r = 0; r < R; ++r)
    for (int dv = 0; dv < DV; ++dv) g[r][dv] = load8(&x[r][8 * dv]);
  for (int64_t j = begin; j < end; ++j) {
    v8 a[DV];
    for (int dv = 0; dv < DV; ++dv) a[dv] = load8(acc + j * kDim + 8 * dv);
    for (int r = 0; r < R; ++r) {
      const float wj = w[r * Lp + j];
      for (int dv = 0; dv < DV; ++dv) a[dv] += wj * g[r][dv];
    }
    for (int dv = 0; dv < DV; ++dv) store8(acc + j * kDim + 8 * dv, a[dv]);
  }
}

// [first, last] real key, widened to whole kKeyLanes-key blocks: the blocks outside get no weight and
// no gradient, so they are skipped (exactly: their terms are all zero). No real key: empty.
inline void key_blocks(const int32_t* m, int64_t L, int64_t* begin, int64_t* end) {
  int64_t first = L, last = -1;
  for (int64_t j = 0; j < L; ++j)
    if (m[j]) {
      first = std::min(first, j);
      last = j;
    }
  *begin = last < 0 ? 0 : first & ~int64_t{kKeyLanes - 1};
  *end = last < 0 ? 0 : round_up_keys(last + 1);
}

// The backward's view of rows i0 .. i0 + R - 1: dO, Q scaled by 1/sqrt(d), delta = dO . O and the
// forward's log-sum-exp. A row whose output gradient is all zero (padding positions, which
// pooling ignores) contributes exactly nothing, and so does a row without a visible key and a
// row past L: all get zeros and lse +inf (weights exp(s - inf) = 0). Whether any row is active.
template <int kDim, int R>
bool backward_rows(const Shape& s, int64_t b, int64_t h, int64_t i0, float scale, const float* q,
                   const float* out, const float* d_out, const float* lb,
                   float (&dout)[R][kDim], float (&qq)[R][kDim], float (&delta)[R],
                   float (&row_lse)[R]) {
  const float inf = std::numeric_limits<float>::infinity();
  const int64_t rows = std::min<int64_t>(R, s.length - i0);
  bool any_active = false;
  for (int r = 0; r < R; ++r) {
    const int64_t i = i0 + r;
    bool active = false;
    if (r < rows && lb[i] != inf) {
      const float* doi = d_out + s.at(b, i, h);
      for (int d = 0; d < kDim; ++d) active |= doi[d] != 0.0f;
    }
    any_active |= active;
    if (!active) {
      for (int d = 0; d < kDim; ++d) dout[r][d] = qq[r][d] = 0.0f;
      delta[r] = 0.0f;
      row_lse[r] = inf;
      continue;
    }
    const float* doi = d_out + s.at(b, i, h);
    const float* oi = out + s.at(b, i, h);
    const float* qi = q + s.at(b, i, h);
    float dl = 0.0f;
    for (int d = 0; d < kDim; ++d) {
      dout[r][d] = doi[d];
      qq[r][d] = qi[d] * scale;  // the 1/sqrt(d) of the scores, folded into dK's factor
      dl += doi[d] * oi[d];
    }
    delta[r] = dl;
    row_lse[r] = lb[i];
  }
  return any_active;
}

template <int kDim>
void forward_pair_blocked(const Shape& s, int64_t b, int64_t h, bool causal, const float* q,
                          const float* k, const float* v, const int32_t* mask, float* out,
                          float* lse, Scratch& w) {
  constexpr int DV = kDim / 8;
  constexpr int R = rows_per_block(DV);
  const int64_t L = s.length, Lp = round_up_keys(L);
  const float scale = 1.0f / std::sqrt(static_cast<float>(kDim));
  const float neg_inf = -std::numeric_limits<float>::infinity();
  w.a.assign(kDim * Lp, 0.0f);  // K transposed [D, Lp]
  w.b.assign(Lp * kDim, 0.0f);  // V rows [Lp, D]
  w.c.assign(Lp, neg_inf);      // padding bias
  w.d.assign(R * Lp, 0.0f);     // scores / weights of R rows
  float *kt = w.a.data(), *vc = w.b.data(), *bias = w.c.data(), *S = w.d.data();
  for (int64_t j = 0; j < L; ++j) {  // (one pass over K and V: two made the forward 15% slower)
    const float* kj = k + s.at(b, j, h);
    const float* vj = v + s.at(b, j, h);
    for (int d = 0; d < kDim; ++d) {
      kt[d * Lp + j] = kj[d];
      vc[j * kDim + d] = vj[d];
    }
    bias[j] = mask[b * L + j] ? 0.0f : neg_inf;
  }
  int64_t kbeg, kend;
  key_blocks(mask + b * L, L, &kbeg, &kend);
  float* lb = lse + s.lse_at(b, h);
  for (int64_t i0 = 0; i0 < L; i0 += R) {
    const int64_t rows = std::min<int64_t>(R, L - i0);
    const int64_t jend = causal ? std::min(kend, round_up_keys(i0 + R)) : kend;
    float qs[R][kDim];
    for (int r = 0; r < R; ++r) {
      const float* qi = q + s.at(b, std::min(i0 + r, L - 1), h);
      for (int d = 0; d < kDim; ++d) qs[r][d] = qi[d] * scale;
    }
    row_dots<kDim, R>(
        qs, kt, Lp, kbeg, jend, [&](int64_t j0) { return loadk(bias + j0); },
        [&](int r, int64_t j0, vk x) { storek(S + r * Lp + j0, x); });
    for (int64_t r = 0; r < rows; ++r) {
      float* row = S + r * Lp;
      if (causal)
        for (int64_t j = i0 + r + 1; j < jend; ++j) row[j] = neg_inf;
      vk m = splatk(neg_inf);
      for (int64_t j0 = kbeg; j0 < jend; j0 += kKeyLanes) {
        const vk x = loadk(row + j0);
        m = x > m ? x : m;
      }
      const float mx = hmaxk(m);
      if (mx == neg_inf) {  // no visible key: zero weights, zero output
        for (int64_t j = kbeg; j < jend; ++j) row[j] = 0.0f;
        lb[i0 + r] = -neg_inf;
        continue;
      }
      vk total = splatk(0.0f);
      for (int64_t j0 = kbeg; j0 < jend; j0 += kKeyLanes) {
        const vk e = vexpk_nonpositive(loadk(row + j0) - mx);
        storek(row + j0, e);
        total += e;
      }
      const float sum = hsumk(total);
      lb[i0 + r] = mx + std::log(sum);
      const float inv = 1.0f / sum;
      for (int64_t j0 = kbeg; j0 < jend; j0 += kKeyLanes) storek(row + j0, loadk(row + j0) * inv);
    }
    v8 o[R][DV];
    weighted_row_sums<kDim, R>(S, Lp, vc, kbeg, std::min(jend, L), o);
    for (int64_t r = 0; r < rows; ++r) {
      float* oi = out + s.at(b, i0 + r, h);
      for (int dv = 0; dv < DV; ++dv) store8(oi + 8 * dv, o[r][dv]);
    }
  }
}

template <int kDim>
void backward_pair_blocked(const Shape& s, int64_t b, int64_t h, bool causal, const float* q,
                           const float* k, const float* v, const int32_t* mask,
                           const float* out, const float* lse,
                           const float* d_out, float* d_q, float* d_k, float* d_v, Scratch& w) {
  constexpr int DV = kDim / 8;
  constexpr int R = rows_per_block(DV);
  const int64_t L = s.length, Lp = round_up_keys(L);
  const float scale = 1.0f / std::sqrt(static_cast<float>(kDim));
  const float neg_inf = -std::numeric_limits<float>::infinity();
  w.a.assign(Lp * kDim, 0.0f);  // K rows [Lp, D]
  w.b.assign(kDim * Lp, 0.0f);  // V transposed [D, Lp]
  w.c.assign(Lp * kDim, 0.0f);  // dK accumulator [Lp, D]
  w.d.assign(Lp * kDim, 0.0f);  // dV accumulator [Lp, D]
  w.e.assign(R * Lp, 0.0f);     // weights of R rows
  w.f.assign(R * Lp, 0.0f);     // dS of R rows
  w.g.assign(kDim * Lp, 0.0f);  // K transposed [D, Lp]
  w.h.assign(Lp, neg_inf);      // padding bias
  float *kc = w.a.data(), *vt = w.b.data(), *dk = w.c.data(), *dv_acc = w.d.data();
  float *P = w.e.data(), *dS = w.f.data(), *kt = w.g.data(), *bias = w.h.data();
  for (int64_t j = 0; j < L; ++j) {
    const float* kj = k + s.at(b, j, h);
    const float* vj = v + s.at(b, j, h);
    for (int d = 0; d < kDim; ++d) {
      kc[j * kDim + d] = kj[d];
      kt[d * Lp + j] = kj[d];
      vt[d * Lp + j] = vj[d];
    }
    bias[j] = mask[b * L + j] ? 0.0f : neg_inf;
  }
  int64_t kbeg, kend;
  key_blocks(mask + b * L, L, &kbeg, &kend);
  const float* lb = lse + s.lse_at(b, h);
  for (int64_t i0 = 0; i0 < L; i0 += R) {
    const int64_t rows = std::min<int64_t>(R, L - i0);
    const int64_t jend = causal ? std::min(kend, round_up_keys(i0 + R)) : kend;
    const int64_t jn = std::max(kbeg, std::min(jend, L));
    float dout[R][kDim], qq[R][kDim], delta[R], row_lse[R];
    if (!backward_rows<kDim, R>(s, b, h, i0, scale, q, out, d_out, lb, dout, qq, delta,
                                row_lse)) {
      for (int64_t r = 0; r < rows; ++r)
        std::memset(d_q + s.at(b, i0 + r, h), 0, kDim * sizeof(float));
      continue;
    }
    // The forward's weights, recomputed from the same scores (the same products in the same
    // order): P_rj = exp(s_rj - lse_r), zero for padding keys, keys after a causal query and
    // inactive rows. (min(., 0) only guards the rounding of lse.)
    row_dots<kDim, R>(
        qq, kt, Lp, kbeg, jend, [&](int64_t j0) { return loadk(bias + j0); },
        [&](int r, int64_t j0, vk x) {
          vk y = x - row_lse[r];
          y = y > splatk(0.0f) ? splatk(0.0f) : y;
          storek(P + r * Lp + j0, vexpk_nonpositive(y));
        });
    if (causal)
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t j = i0 + r + 1; j < jend; ++j) P[r * Lp + j] = 0.0f;
    // dV_j += sum_r P_rj dO_r
    add_weighted_to_rows<kDim, R>(P, Lp, dout, kbeg, jn, dv_acc);
    // dS_rj = P_rj (dO_r . V_j - delta_r)
    row_dots<kDim, R>(
        dout, vt, Lp, kbeg, jend, [](int64_t) { return splatk(0.0f); },
        [&](int r, int64_t j0, vk x) {
          storek(dS + r * Lp + j0, loadk(P + r * Lp + j0) * (x - delta[r]));
        });
    // dQ_r = scale sum_j dS_rj K_j
    {
      v8 acc[R][DV];
      weighted_row_sums<kDim, R>(dS, Lp, kc, kbeg, jn, acc);
      for (int64_t r = 0; r < rows; ++r) {
        float* dqi = d_q + s.at(b, i0 + r, h);
        for (int dv = 0; dv < DV; ++dv) store8(dqi + 8 * dv, acc[r][dv] * scale);
      }
    }
    // dK_j += sum_r dS_rj (scale Q_r)
    add_weighted_to_rows<kDim, R>(dS, Lp, qq, kbeg, jn, dk);
  }
  for (int64_t j = 0; j < L; ++j) {
    std::memcpy(d_k + s.at(b, j, h), dk + j * kDim, kDim * sizeof(float));
    std::memcpy(d_v + s.at(b, j, h), dv_acc + j * kDim, kDim * sizeof(float));
  }
}

template <int kDim>
void forward_all(const Shape& s, bool causal, textattn::Workers workers, const float* q,
                 const float* k, const float* v, const int32_t* mask, float* out, float* lse) {
  for_each_pair(s, workers, [&](int64_t b, int64_t h) {
    if constexpr (kDim > 0 && kDim % 8 == 0) {
      thread_local Scratch w;
      forward_pair_blocked<kDim>(s, b, h, causal, q, k, v, mask, out, lse, w);
    } else {
      thread_local std::vector<float> kt, bias, row;
      forward_pair<kDim>(s, b, h, causal, q, k, v, mask, out, lse, kt, bias, row);
    }
  });
}

template <int kDim>
void backward_all(const Shape& s, bool causal, textattn::Workers workers, const float* q,
                  const float* k, const float* v, const int32_t* mask, const float* out,
                  const float* lse, const float* d_out, float* d_q, float* d_k, float* d_v) {
  for_each_pair(s, workers, [&](int64_t b, int64_t h) {
    if constexpr (kDim > 0 && kDim % 8 == 0) {
      thread_local Scratch w;
      backward_pair_blocked<kDim>(s, b, h, causal, q, k, v, mask, out, lse, d_out, d_q, d_k,
                                  d_v, w);
    } else {
      thread_local std::vector<float> kt, bias, scratch;
      backward_pair<kDim>(s, b, h, causal, q, k, v, mask, out, lse, d_out, d_q, d_k, d_v, kt,
                          bias, scratch);
    }
  });
}

// Self-attention only: every [batch, length, heads, dim] operand has q's shape.
ffi::Error shape_of(const ffi::Buffer<ffi::F32>& q, const ffi::Buffer<ffi::S32>& mask,
                    std::initializer_list<const ffi::Buffer<ffi::F32>*> same_as_q, Shape* s) {
  auto dims = q.dimensions();
  if (dims.size() != 4) return ffi::Error::InvalidArgument("q must be [batch, length, heads, dim]");
  for (const auto* other : same_as_q) {
    auto od = other->dimensions();
    if (od.size() != 4 || !std::equal(od.begin(), od.end(), dims.begin()))
      return ffi::Error::InvalidArgument("k, v, out and d_out must have q's shape");
  }
  *s = Shape{dims[0], dims[1], dims[2], dims[3]};
  auto md = mask.dimensions();
  if (md.size() != 2 || md[0] != s->batch || md[1] != s->length)
    return ffi::Error::InvalidArgument("mask must be [batch, length]");
  if (s->dim > 1024) return ffi::Error::InvalidArgument("head_dim above 1024 is not supported");
  return ffi::Error::Success();
}

#define TEXTATTN_DISPATCH_DIM(dim, fn, ...)           \
  switch (dim) {                                      \
    case 8: fn<8>(__VA_ARGS__); break;                \
    case 16: fn<16>(__VA_ARGS__); break;              \
    case 32: fn<32>(__VA_ARGS__); break;              \
    case 64: fn<64>(__VA_ARGS__); break;              \
    default: fn<0>(__VA_ARGS__); break;               \
  }

ffi::Error Forward(ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> k, ffi::Buffer<ffi::F32> v,
                   ffi::Buffer<ffi::S32> mask, bool causal, int64_t threads, bool xla_pool,
                   ffi::ThreadPool pool,
                   ffi::ResultBuffer<ffi::F32> out, ffi::ResultBuffer<ffi::F32> lse) {
  Shape s;
  if (auto err = shape_of(q, mask, {&k, &v}, &s); err.failure()) return err;
  const textattn::Workers workers{threads, xla_pool ? &pool : nullptr};
  try {  // (std::thread or an allocation may throw; exceptions must not cross into XLA)
    TEXTATTN_DISPATCH_DIM(s.dim, forward_all, s, causal, workers, q.typed_data(), k.typed_data(),
                          v.typed_data(), mask.typed_data(), out->typed_data(),
                          lse->typed_data());
  } catch (const std::exception& e) {
    return ffi::Error::Internal(std::string("textattn native attention forward: ") + e.what());
  }
  return ffi::Error::Success();
}

ffi::Error Backward(ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> k, ffi::Buffer<ffi::F32> v,
                    ffi::Buffer<ffi::S32> mask, ffi::Buffer<ffi::F32> out,
                    ffi::Buffer<ffi::F32> lse, ffi::Buffer<ffi::F32> d_out, bool causal,
                    int64_t threads, bool xla_pool, ffi::ThreadPool pool,
                    ffi::ResultBuffer<ffi::F32> d_q,
                    ffi::ResultBuffer<ffi::F32> d_k, ffi::ResultBuffer<ffi::F32> d_v) {
  Shape s;
  if (auto err = shape_of(q, mask, {&k, &v, &out, &d_out}, &s); err.failure()) return err;
  auto ld = lse.dimensions();
  if (ld.size() != 3 || ld[0] != s.batch || ld[1] != s.heads || ld[2] != s.length)
    return ffi::Error::InvalidArgument("lse must be [batch, heads, length]");
  const textattn::Workers workers{threads, xla_pool ? &pool : nullptr};
  try {
    TEXTATTN_DISPATCH_DIM(s.dim, backward_all, s, causal, workers, q.typed_data(),
                          k.typed_data(), v.typed_data(), mask.typed_data(), out.typed_data(),
                          lse.typed_data(), d_out.typed_data(), d_q->typed_data(),
                          d_k->typed_data(), d_v->typed_data());
  } catch (const std::exception& e) {
    return ffi::Error::Internal(std::string("textattn native attention backward: ") + e.what());
  }
  return ffi::Error::Success();
}

}  // namespace

// The width of the blocked kernels' key vectors in this build (vec8.h: 16 or 8), for
// native.key_lanes() (tests, benchmark records).
extern "C" int textattn_key_lanes() { return textattn::kKeyLanes; }

XLA_FFI_DEFINE_HANDLER_SYMBOL(TextattnSoftmaxAttentionForward, Forward,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Attr<bool>("causal")
                                  .Attr<int64_t>("threads")
                                  .Attr<bool>("xla_pool")
                                  .Ctx<ffi::ThreadPool>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(TextattnSoftmaxAttentionBackward, Backward,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Attr<bool>("causal")
                                  .Attr<int64_t>("threads")
                                  .Attr<bool>("xla_pool")
                                  .Ctx<ffi::ThreadPool>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
