// Fastformer additive attention (arXiv 2108.09084) for CPUs, forward and backward, as XLA FFI
// custom calls.
//
// Built on first use by textattn/native.py together with softmax_attention.cc, and called from
// jax.jit through jax.ffi.ffi_call; textattn.attention.native_additive_attention is the JAX
// side (custom VJP). Layouts are the model's own ([batch, length, heads, head_dim], read here as
// [batch, length, features] with feature f = h * head_dim + d):
//
//   q, k, u, d_u, d_q, d_k      : float32 [batch, length, heads * head_dim]
//   mask                        : int32   [batch, length], non-zero = real token
//   w_alpha, w_beta, d_w_*      : float32 [heads * head_dim, heads] (the "shared" scoring; the
//                                 JAX side turns the per-head form into this block-diagonal one)
//   alpha, beta (residuals)     : float32 [batch, length, heads]
//   g_q, g_k (residuals)        : float32 [batch, heads * head_dim]
//
// Semantics are those of textattn.attention.additive_attention, per example and head:
//
//   alpha = softmax over real tokens of (q . w_alpha) / sqrt(head_dim)   (0 at padding)
//   g_q   = sum_i alpha_i q_i ;  p_i = k_i * g_q
//   beta  = softmax over real tokens of (p . w_beta) / sqrt(head_dim)    (0 at padding)
//   g_k   = sum_i beta_i p_i ;   u_i = q_i * g_k
//
// An example with no real token gets alpha = beta = 0, so g_q = g_k = 0 and u = 0.
//
// Why by hand: the whole computation is O(length * features) per example, a few hundred
// kilobytes that fit in cache, but XLA:CPU runs it as ~50 separate ops: batched matrix-vector
// products over the length axis with transposes around them, and the length reductions as
// trees of reduce-window ops (`git show 50fcafb:experiments/RESULTS.md`, "Fourth round"). Here each example's
// forward, and its backward, are a few passes over its rows while they stay in L1/L2.
//
// Examples are independent, so they are split over up to `threads` workers (XLA's intra-op
// thread pool or std::threads of our own, parallel.h); the scoring kernels' gradients are
// summed per example into scratch and then over examples in a fixed order, so results do not
// depend on the workers.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <limits>
#include <string>
#include <vector>

#include "parallel.h"
#include "vec8.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

struct Dims {
  int64_t batch, length, heads, dim;
  int64_t features() const { return heads * dim; }
};

template <typename Body>
void for_each_example(int64_t batch, textattn::Workers workers, Body body) {
  textattn::for_each_task(batch, workers, body);
}

// Rows of F = heads * head_dim features are processed W features at a time with vectors V of
// W floats: W = 16 (vec8.h's vk, one AVX-512 register) where the CPU has AVX-512F and head_dim
// is a multiple of 16, else W = 8 (vec8.h's v8: AVX2, NEON pairs). head_dim is a multiple of W,
// so a chunk never straddles two heads. $TEXTATTN_NATIVE_KEY_LANES=8 forces W = 8 everywhere.
using textattn::v8;

template <typename V>
constexpr int kLanes = static_cast<int>(sizeof(V) / sizeof(float));
template <typename V>
inline V vload(const float* p) {
  V x;
  std::memcpy(&x, p, sizeof(x));
  return x;
}
template <typename V>
inline void vstore(float* p, V x) { std::memcpy(p, &x, sizeof(x)); }
template <typename V>
inline float vhsum(V x) {
  float t = 0.0f;
  for (int l = 0; l < kLanes<V>; ++l) t += x[l];
  return t;
}

// One example's view: L rows of F features; C = F / W chunks, kChunks = head_dim / W per head.
// (kChunks = 0: any multiple of W, chunks per head at run time.)
template <typename V, int kChunks>
struct Example {
  static constexpr int W = kLanes<V>;
  int64_t L, H, F, C;
  int64_t head(int64_t c) const { return c / (kChunks > 0 ? kChunks : C / H); }
};

// scores[i, h] = scale * x_i . w_h (w_t: [H, F]) for real tokens i; 0 at padding (unused).
template <typename V, int kChunks>
void score(const Example<V, kChunks>& e, const int32_t* mask, const float* x, const float* w_t,
           float scale, float* scores) {
  for (int64_t i = 0; i < e.L; ++i) {
    for (int64_t h = 0; h < e.H; ++h) {
      V acc = {};
      if (mask[i])
        for (int64_t c = 0; c < e.C; ++c)
          acc += vload<V>(x + i * e.F + e.W * c) * vload<V>(w_t + h * e.F + e.W * c);
      scores[i * e.H + h] = vhsum(acc) * scale;
    }
  }
}

// In place: scores [L, H] -> softmax over the real tokens of each head's column, 0 at padding;
// all zero when the example has no real token.
// (Whether a token is real comes from the mask, not from the scores: NaN scores stay NaN.)
void masked_softmax(int64_t L, int64_t H, const int32_t* mask, float* w) {
  const bool any_real = std::any_of(mask, mask + L, [](int32_t m) { return m != 0; });
  for (int64_t h = 0; h < H; ++h) {
    if (!any_real) {
      for (int64_t i = 0; i < L; ++i) w[i * H + h] = 0.0f;
      continue;
    }
    float mx = -std::numeric_limits<float>::infinity();
    for (int64_t i = 0; i < L; ++i)
      if (mask[i]) mx = std::max(mx, w[i * H + h]);
    float total = 0.0f;
    for (int64_t i = 0; i < L; ++i) {
      const float x = mask[i] ? std::exp(w[i * H + h] - mx) : 0.0f;
      w[i * H + h] = x;
      total += x;
    }
    const float inv = 1.0f / total;
    for (int64_t i = 0; i < L; ++i) w[i * H + h] *= inv;
  }
}

// pooled[f] = sum_i weights[i, h(f)] * x[i, f] over real tokens (padding has weight 0).
template <typename V, int kChunks>
void pool(const Example<V, kChunks>& e, const int32_t* mask, const float* weights, const float* x,
          float* pooled) {
  for (int64_t c = 0; c < e.C; ++c) vstore(pooled + e.W * c, V{});
  for (int64_t i = 0; i < e.L; ++i) {
    if (!mask[i]) continue;
    for (int64_t c = 0; c < e.C; ++c)
      vstore(pooled + e.W * c, vload<V>(pooled + e.W * c) +
                                 weights[i * e.H + e.head(c)] * vload<V>(x + i * e.F + e.W * c));
  }
}

// out[i, f] = a[i, f] * g[f] for every row.
template <typename V, int kChunks>
void scale_rows(const Example<V, kChunks>& e, const float* a, const float* g, float* out) {
  for (int64_t i = 0; i < e.L; ++i)
    for (int64_t c = 0; c < e.C; ++c)
      vstore(out + i * e.F + e.W * c, vload<V>(a + i * e.F + e.W * c) * vload<V>(g + e.W * c));
}

std::vector<float> transpose(const float* w, int64_t rows, int64_t cols) {
  std::vector<float> t(rows * cols);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) t[c * rows + r] = w[r * cols + c];
  return t;
}

template <typename V, int kChunks>
void forward_example(const Example<V, kChunks>& e, float scale, const float* q, const float* k,
                     const int32_t* mask, const float* wa_t, const float* wb_t, float* u,
                     float* alpha, float* beta, float* g_q, float* g_k, std::vector<float>& p) {
  score(e, mask, q, wa_t, scale, alpha);
  masked_softmax(e.L, e.H, mask, alpha);
  pool(e, mask, alpha, q, g_q);
  p.resize(e.L * e.F);
  scale_rows(e, k, g_q, p.data());
  score(e, mask, p.data(), wb_t, scale, beta);
  masked_softmax(e.L, e.H, mask, beta);
  pool(e, mask, beta, p.data(), g_k);
  scale_rows(e, q, g_k, u);
}

// Softmax backward in place: d [L, H] (gradient w.r.t. the weights w) -> gradient w.r.t. the
// scores, w * (d - sum_i w_i d_i). Padding has w = 0, so it gets 0.
void softmax_backward(int64_t L, int64_t H, const float* w, float* d) {
  for (int64_t h = 0; h < H; ++h) {
    float c = 0.0f;
    for (int64_t i = 0; i < L; ++i) c += w[i * H + h] * d[i * H + h];
    for (int64_t i = 0; i < L; ++i) d[i * H + h] = w[i * H + h] * (d[i * H + h] - c);
  }
}

// The backward of pooled = sum_i weights[i, h] x_i (given d_pooled) and of the scores that made
// the weights, for every row i:
//   d_weights[i, h] = d_pooled[h] . x_i[h]                        (then the softmax backward)
//   d_x[i] += weights[i, h(f)] * d_pooled  and  d_x[i] += scale * sum_h d_scores[i, h] w_h
//   d_w[h] += scale * sum_i d_scores[i, h] x_i                    (d_w transposed, [H, F])
// `d_x` is accumulated into; padding rows have zero weights and zero score gradients.
template <typename V, int kChunks>
void pool_and_score_backward(const Example<V, kChunks>& e, const int32_t* mask, const float* x,
                             const float* weights, const float* d_pooled, const float* w_t,
                             float scale, float* d_weights, float* d_x, float* d_w) {
  const int64_t per_head = e.C / e.H;
  for (int64_t i = 0; i < e.L; ++i)
    for (int64_t h = 0; h < e.H; ++h) {
      V acc = {};
      if (mask[i])
        for (int64_t c = h * per_head; c < (h + 1) * per_head; ++c)
          acc += vload<V>(d_pooled + e.W * c) * vload<V>(x + i * e.F + e.W * c);
      d_weights[i * e.H + h] = vhsum(acc);
    }
  softmax_backward(e.L, e.H, weights, d_weights);
  for (int64_t i = 0; i < e.L; ++i) {
    if (!mask[i]) continue;
    const float* xi = x + i * e.F;
    float* dxi = d_x + i * e.F;
    for (int64_t c = 0; c < e.C; ++c) {
      const int64_t h = e.head(c);
      V dx = vload<V>(dxi + e.W * c) + weights[i * e.H + h] * vload<V>(d_pooled + e.W * c);
      for (int64_t g = 0; g < e.H; ++g)
        dx += (scale * d_weights[i * e.H + g]) * vload<V>(w_t + g * e.F + e.W * c);
      vstore(dxi + e.W * c, dx);
    }
    for (int64_t g = 0; g < e.H; ++g) {
      const float ds = scale * d_weights[i * e.H + g];
      for (int64_t c = 0; c < e.C; ++c)
        vstore(d_w + g * e.F + e.W * c, vload<V>(d_w + g * e.F + e.W * c) + ds * vload<V>(xi + e.W * c));
    }
  }
}

// column sums: out[f] = sum_i a[i, f] * b[i, f].
template <typename V, int kChunks>
void dot_columns(const Example<V, kChunks>& e, const float* a, const float* b, float* out) {
  for (int64_t c = 0; c < e.C; ++c) {
    V acc = {};
    for (int64_t i = 0; i < e.L; ++i)
      acc += vload<V>(a + i * e.F + e.W * c) * vload<V>(b + i * e.F + e.W * c);
    vstore(out + e.W * c, acc);
  }
}

struct Scratch {
  std::vector<float> p, d_p, d_weights, d_gk, d_gq;
};

template <typename V, int kChunks>
void backward_example(const Example<V, kChunks>& e, float scale, const float* q, const float* k,
                      const int32_t* mask, const float* wa_t, const float* wb_t,
                      const float* alpha, const float* beta, const float* g_q, const float* g_k,
                      const float* d_u, float* d_q, float* d_k, float* d_wa_t, float* d_wb_t,
                      Scratch& t) {
  t.p.resize(e.L * e.F);
  t.d_p.assign(e.L * e.F, 0.0f);
  t.d_weights.resize(e.L * e.H);
  t.d_gk.resize(e.F);
  t.d_gq.resize(e.F);
  // u = q * g_k
  scale_rows(e, d_u, g_k, d_q);
  dot_columns(e, d_u, q, t.d_gk.data());
  // g_k = sum_i beta_i p_i, beta = softmax(scale * p . w_beta), with p = k * g_q
  scale_rows(e, k, g_q, t.p.data());
  pool_and_score_backward(e, mask, t.p.data(), beta, t.d_gk.data(), wb_t, scale,
                          t.d_weights.data(), t.d_p.data(), d_wb_t);
  // p = k * g_q
  scale_rows(e, t.d_p.data(), g_q, d_k);
  dot_columns(e, t.d_p.data(), k, t.d_gq.data());
  // g_q = sum_i alpha_i q_i, alpha = softmax(scale * q . w_alpha)
  pool_and_score_backward(e, mask, q, alpha, t.d_gq.data(), wa_t, scale, t.d_weights.data(),
                          d_q, d_wa_t);
}

template <typename V, int kChunks>
void forward_all(const Dims& s, textattn::Workers workers, const float* q, const float* k,
                 const int32_t* mask, const float* w_alpha, const float* w_beta, float* u,
                 float* alpha, float* beta, float* g_q, float* g_k) {
  const Example<V, kChunks> e{s.length, s.heads, s.features(), s.features() / kLanes<V>};
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.dim));
  const std::vector<float> wa_t = transpose(w_alpha, e.F, e.H);
  const std::vector<float> wb_t = transpose(w_beta, e.F, e.H);
  std::vector<std::vector<float>> p(workers.for_tasks(s.batch));
  const int64_t LF = e.L * e.F, LH = e.L * e.H;
  for_each_example(s.batch, workers, [&](int64_t t, int64_t b) {
    forward_example(e, scale, q + b * LF, k + b * LF, mask + b * e.L, wa_t.data(), wb_t.data(),
                    u + b * LF, alpha + b * LH, beta + b * LH, g_q + b * e.F, g_k + b * e.F,
                    p[t]);
  });
}

template <typename V, int kChunks>
void backward_all(const Dims& s, textattn::Workers workers, const float* q, const float* k,
                  const int32_t* mask, const float* w_alpha, const float* w_beta,
                  const float* alpha, const float* beta, const float* g_q, const float* g_k,
                  const float* d_u, float* d_q, float* d_k, float* d_w_alpha, float* d_w_beta) {
  const Example<V, kChunks> e{s.length, s.heads, s.features(), s.features() / kLanes<V>};
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.dim));
  const int64_t F = e.F, H = e.H, LF = e.L * e.F, LH = e.L * e.H;
  const std::vector<float> wa_t = transpose(w_alpha, F, H);
  const std::vector<float> wb_t = transpose(w_beta, F, H);
  // Per-example scoring-kernel gradients ([H, F] each), summed over examples in order below.
  std::vector<float> d_wa(s.batch * H * F, 0.0f), d_wb(s.batch * H * F, 0.0f);
  std::vector<Scratch> scratch(workers.for_tasks(s.batch));
  for_each_example(s.batch, workers, [&](int64_t t, int64_t b) {
    backward_example(e, scale, q + b * LF, k + b * LF, mask + b * e.L, wa_t.data(), wb_t.data(),
                     alpha + b * LH, beta + b * LH, g_q + b * F, g_k + b * F, d_u + b * LF,
                     d_q + b * LF, d_k + b * LF, d_wa.data() + b * H * F,
                     d_wb.data() + b * H * F, scratch[t]);
  });
  for (int64_t f = 0; f < F; ++f)
    for (int64_t h = 0; h < H; ++h) {
      float sa = 0.0f, sb = 0.0f;
      for (int64_t b = 0; b < s.batch; ++b) {
        sa += d_wa[(b * H + h) * F + f];
        sb += d_wb[(b * H + h) * F + f];
      }
      d_w_alpha[f * H + h] = sa;
      d_w_beta[f * H + h] = sb;
    }
}

// 16-float chunks where the build has them (AVX-512F) and head_dim allows; else 8-float ones.
#define TEXTATTN_DISPATCH_DIM(dim, fn, ...)                        \
  if (textattn::kKeyLanes == 16 && (dim) % 16 == 0) {              \
    switch (dim) {                                                 \
      case 16: fn<textattn::vk, 1>(__VA_ARGS__); break;            \
      case 32: fn<textattn::vk, 2>(__VA_ARGS__); break;            \
      case 64: fn<textattn::vk, 4>(__VA_ARGS__); break;            \
      default: fn<textattn::vk, 0>(__VA_ARGS__); break;            \
    }                                                              \
  } else {                                                         \
    switch (dim) {                                                 \
      case 8: fn<v8, 1>(__VA_ARGS__); break;                       \
      case 16: fn<v8, 2>(__VA_ARGS__); break;                      \
      case 32: fn<v8, 4>(__VA_ARGS__); break;                      \
      case 64: fn<v8, 8>(__VA_ARGS__); break;                      \
      default: fn<v8, 0>(__VA_ARGS__); break;                      \
    }                                                              \
  }

ffi::Error check(const ffi::Buffer<ffi::F32>& q, const ffi::Buffer<ffi::F32>& k,
                 const ffi::Buffer<ffi::S32>& mask, const ffi::Buffer<ffi::F32>& w_alpha,
                 const ffi::Buffer<ffi::F32>& w_beta, int64_t heads, Dims* s) {
  auto dims = q.dimensions();
  if (dims.size() != 3) return ffi::Error::InvalidArgument("q must be [batch, length, features]");
  auto kd = k.dimensions();
  if (kd.size() != 3 || !std::equal(kd.begin(), kd.end(), dims.begin()))
    return ffi::Error::InvalidArgument("k must have q's shape");
  if (heads < 1 || dims[2] % heads || (dims[2] / heads) % 8)
    return ffi::Error::InvalidArgument(
        "heads must divide the feature count into head_dims that are multiples of 8");
  *s = Dims{dims[0], dims[1], heads, dims[2] / heads};
  auto md = mask.dimensions();
  if (md.size() != 2 || md[0] != s->batch || md[1] != s->length)
    return ffi::Error::InvalidArgument("mask must be [batch, length]");
  for (const auto* w : {&w_alpha, &w_beta}) {
    auto wd = w->dimensions();
    if (wd.size() != 2 || wd[0] != s->features() || wd[1] != heads)
      return ffi::Error::InvalidArgument("scoring kernels must be [features, heads]");
  }
  return ffi::Error::Success();
}

ffi::Error Forward(ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> k, ffi::Buffer<ffi::S32> mask,
                   ffi::Buffer<ffi::F32> w_alpha, ffi::Buffer<ffi::F32> w_beta, int64_t heads,
                   int64_t threads, bool xla_pool, ffi::ThreadPool pool,
                   ffi::ResultBuffer<ffi::F32> u,
                   ffi::ResultBuffer<ffi::F32> alpha, ffi::ResultBuffer<ffi::F32> beta,
                   ffi::ResultBuffer<ffi::F32> g_q, ffi::ResultBuffer<ffi::F32> g_k) {
  Dims s;
  if (auto err = check(q, k, mask, w_alpha, w_beta, heads, &s); err.failure()) return err;
  const textattn::Workers workers{threads, xla_pool ? &pool : nullptr};
  try {  // (std::thread or an allocation may throw; exceptions must not cross into XLA)
    TEXTATTN_DISPATCH_DIM(s.dim, forward_all, s, workers, q.typed_data(), k.typed_data(),
                          mask.typed_data(), w_alpha.typed_data(), w_beta.typed_data(),
                          u->typed_data(), alpha->typed_data(), beta->typed_data(),
                          g_q->typed_data(), g_k->typed_data());
  } catch (const std::exception& e) {
    return ffi::Error::Internal(std::string("textattn additive attention forward: ") + e.what());
  }
  return ffi::Error::Success();
}

ffi::Error Backward(ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> k, ffi::Buffer<ffi::S32> mask,
                    ffi::Buffer<ffi::F32> w_alpha, ffi::Buffer<ffi::F32> w_beta,
                    ffi::Buffer<ffi::F32> alpha, ffi::Buffer<ffi::F32> beta,
                    ffi::Buffer<ffi::F32> g_q, ffi::Buffer<ffi::F32> g_k,
                    ffi::Buffer<ffi::F32> d_u, int64_t heads, int64_t threads, bool xla_pool,
                    ffi::ThreadPool pool,
                    ffi::ResultBuffer<ffi::F32> d_q, ffi::ResultBuffer<ffi::F32> d_k,
                    ffi::ResultBuffer<ffi::F32> d_w_alpha, ffi::ResultBuffer<ffi::F32> d_w_beta) {
  Dims s;
  if (auto err = check(q, k, mask, w_alpha, w_beta, heads, &s); err.failure()) return err;
  const textattn::Workers workers{threads, xla_pool ? &pool : nullptr};
  try {
    TEXTATTN_DISPATCH_DIM(s.dim, backward_all, s, workers, q.typed_data(), k.typed_data(),
                          mask.typed_data(), w_alpha.typed_data(), w_beta.typed_data(),
                          alpha.typed_data(), beta.typed_data(), g_q.typed_data(), g_k.typed_data(),
                          d_u.typed_data(), d_q->typed_data(), d_k->typed_data(),
                          d_w_alpha->typed_data(), d_w_beta->typed_data());
  } catch (const std::exception& e) {
    return ffi::Error::Internal(std::string("textattn additive attention backward: ") + e.what());
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(TextattnAdditiveAttentionForward, Forward,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // q
                                  .Arg<ffi::Buffer<ffi::F32>>()  // k
                                  .Arg<ffi::Buffer<ffi::S32>>()  // mask
                                  .Arg<ffi::Buffer<ffi::F32>>()  // w_alpha
                                  .Arg<ffi::Buffer<ffi::F32>>()  // w_beta
                                  .Attr<int64_t>("heads")
                                  .Attr<int64_t>("threads")
                                  .Attr<bool>("xla_pool")
                                  .Ctx<ffi::ThreadPool>()
                                  .Ret<ffi::Buffer<ffi::F32>>()   // u
                                  .Ret<ffi::Buffer<ffi::F32>>()   // alpha
                                  .Ret<ffi::Buffer<ffi::F32>>()   // beta
                                  .Ret<ffi::Buffer<ffi::F32>>()   // g_q
                                  .Ret<ffi::Buffer<ffi::F32>>());  // g_k

XLA_FFI_DEFINE_HANDLER_SYMBOL(TextattnAdditiveAttentionBackward, Backward,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // q
                                  .Arg<ffi::Buffer<ffi::F32>>()  // k
                                  .Arg<ffi::Buffer<ffi::S32>>()  // mask
                                  .Arg<ffi::Buffer<ffi::F32>>()  // w_alpha
                                  .Arg<ffi::Buffer<ffi::F32>>()  // w_beta
                                  .Arg<ffi::Buffer<ffi::F32>>()  // alpha
                                  .Arg<ffi::Buffer<ffi::F32>>()  // beta
                                  .Arg<ffi::Buffer<ffi::F32>>()  // g_q
                                  .Arg<ffi::Buffer<ffi::F32>>()  // g_k
                                  .Arg<ffi::Buffer<ffi::F32>>()  // d_u
                                  .Attr<int64_t>("heads")
                                  .Attr<int64_t>("threads")
                                  .Attr<bool>("xla_pool")
                                  .Ctx<ffi::ThreadPool>()
                                  .Ret<ffi::Buffer<ffi::F32>>()   // d_q
                                  .Ret<ffi::Buffer<ffi::F32>>()   // d_k
                                  .Ret<ffi::Buffer<ffi::F32>>()   // d_w_alpha
                                  .Ret<ffi::Buffer<ffi::F32>>());  // d_w_beta
