// 8-float vectors for the native kernels (softmax_attention.cc, additive_attention.cc): GCC/Clang
// vector extensions, 256-bit on AVX2 (and AVX-512's 256-bit forms), split in two on 128-bit
// units (Zen 1, NEON); and the exponential both kernels' softmaxes use.
#ifndef TEXTATTN_NATIVE_VEC8_H_
#define TEXTATTN_NATIVE_VEC8_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

namespace textattn {

// exp(x) for x <= 0 (the inputs are s - max(s)), vectorisable: 2^(x log2 e) split into an
// integer power of two (exponent bits) and a degree-6 polynomial on [-ln2/2, ln2/2].
// Relative error < 2e-7 on [-87, 0]; inputs below -87 give ~0 (callers zero masked entries).
inline float exp_nonpositive(float x) {
  x = std::max(x, -87.0f);
  const float t = x * 1.44269504088896341f;
  const float n = std::nearbyint(t);
  const float r = x - n * 0.693145751953125f - n * 1.428606765330187045e-06f;
  float p = 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

typedef float v8 __attribute__((vector_size(32)));

typedef int32_t v8i __attribute__((vector_size(32)));

inline v8 load8(const float* p) {
  v8 x;
  std::memcpy(&x, p, sizeof(x));
  return x;
}
inline void store8(float* p, v8 x) { std::memcpy(p, &x, sizeof(x)); }
inline v8 splat(float x) { return v8{x, x, x, x, x, x, x, x}; }
inline float hsum(v8 x) {
  float t = 0.0f;
  for (int l = 0; l < 8; ++l) t += x[l];
  return t;
}
inline float hmax(v8 x) {
  float t = x[0];
  for (int l = 1; l < 8; ++l) t = std::max(t, x[l]);
  return t;
}

// exp_nonpositive on a vector of floats V (int lanes VI; the same polynomial and rounding at
// every width, so a lane's value does not depend on it); lanes equal to -inf give exactly 0.
template <typename V, typename VI>
inline V vexp_nonpositive_lanes(V x) {
  const V zero{};
  const VI masked = x == zero - std::numeric_limits<float>::infinity();
  x = x < zero - 87.0f ? zero - 87.0f : x;
  const V t = x * 1.44269504088896341f;
  const VI ni = __builtin_convertvector(t - 0.5f, VI);  // round half down, t <= 0
  const V n = __builtin_convertvector(ni, V);
  const V r = x - n * 0.693145751953125f - n * 1.428606765330187045e-06f;
  V p = zero + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const V scale = (V)((ni + 127) << 23);
  return masked ? zero : p * scale;
}
inline v8 vexp_nonpositive(v8 x) { return vexp_nonpositive_lanes<v8, v8i>(x); }

inline int64_t round_up8(int64_t n) { return (n + 7) & ~int64_t{7}; }

// Key-direction vectors of the blocked softmax kernels (softmax_attention.cc: a score row's keys,
// kKeyLanes at a time): 16 floats where the compiler targets AVX-512F (one zmm register: half the
// instructions of two ymm ones; Zen 4's double-pumped units included, a Q K^T tile at head_dim
// 16 runs ~1.3x faster there), else 8 (AVX2, NEON pairs). -DTEXTATTN_KEY_LANES=8 forces the
// 8-float path on an AVX-512 machine (native/__init__.py: TEXTATTN_NATIVE_KEY_LANES=8, for tests
// and A/B timing). The dimension direction (head_dim / 8 vectors a row) stays 8 floats wide.
// additive_attention.cc's feature chunks use vk too where head_dim is a multiple of 16.
#ifndef TEXTATTN_KEY_LANES
#if defined(__AVX512F__)
#define TEXTATTN_KEY_LANES 16
#else
#define TEXTATTN_KEY_LANES 8
#endif
#endif
constexpr int kKeyLanes = TEXTATTN_KEY_LANES;
static_assert(kKeyLanes == 8 || kKeyLanes == 16, "TEXTATTN_KEY_LANES must be 8 or 16");
typedef float vk __attribute__((vector_size(4 * kKeyLanes)));
typedef int32_t vki __attribute__((vector_size(4 * kKeyLanes)));

inline vk loadk(const float* p) {
  vk x;
  std::memcpy(&x, p, sizeof(x));
  return x;
}
inline void storek(float* p, vk x) { std::memcpy(p, &x, sizeof(x)); }
inline vk splatk(float x) { return x - vk{}; }  // (a broadcast; a lane-by-lane fill is slower)
inline float hsumk(vk x) {
  float t = 0.0f;
  for (int l = 0; l < kKeyLanes; ++l) t += x[l];
  return t;
}
inline float hmaxk(vk x) {
  float t = x[0];
  for (int l = 1; l < kKeyLanes; ++l) t = std::max(t, x[l]);
  return t;
}
inline vk vexpk_nonpositive(vk x) { return vexp_nonpositive_lanes<vk, vki>(x); }
inline int64_t round_up_keys(int64_t n) {
  return (n + kKeyLanes - 1) & ~int64_t{kKeyLanes - 1};
}

}  // namespace textattn

#endif  // TEXTATTN_NATIVE_VEC8_H_
