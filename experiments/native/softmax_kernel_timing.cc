// The native softmax kernel alone (textattn/attention/native/softmax_attention.cc), timed without
// JAX or XLA around it: the forward or the backward at MiniLM's shape [32, 256, 12, 32]
// (batch, length, heads, head_dim), every 4th example padded after 150 tokens, best of 8 calls.
// What the kernel's tile sizes were chosen by (RESULTS §26). Build and run from the repo root:
//
//   c++ -O3 -march=native -std=c++17 -pthread -fno-math-errno -fno-trapping-math \
//       -fassociative-math -fno-signed-zeros -w -I "$(python -c 'import jax; print(jax.ffi.include_dir())')" \
//       -I textattn/attention/native experiments/native/softmax_kernel_timing.cc -o /tmp/timing
//   /tmp/timing THREADS forward|backward
#include "softmax_attention.cc"

#include <chrono>
#include <cstdio>
#include <random>

int main(int argc, char** argv) {
  const int64_t B = 32, L = 256, H = 12, D = 32;
  const int threads = argc > 1 ? std::atoi(argv[1]) : 1;
  const bool backward = argc > 2 && std::string(argv[2]) == "backward";
  const Shape s{B, L, H, D};
  const size_t n = B * L * H * D;
  std::vector<float> q(n), k(n), v(n), out(n), d_out(n), d_q(n), d_k(n), d_v(n), lse(B * H * L);
  std::mt19937 gen(0);
  std::normal_distribution<float> normal;
  for (auto* x : {&q, &k, &v, &d_out})
    for (auto& y : *x) y = normal(gen);
  std::vector<int32_t> mask(B * L, 1);
  for (int64_t b = 1; b < B; b += 4)
    for (int64_t j = 150; j < L; ++j) mask[b * L + j] = 0;
  const textattn::Workers workers{threads, nullptr};
  forward_all<32>(s, false, workers, q.data(), k.data(), v.data(), mask.data(), out.data(),
                  lse.data());  // (the backward's residuals)
  double best = 1e9;
  for (int call = 0; call < 8; ++call) {
    const auto start = std::chrono::steady_clock::now();
    if (backward)
      backward_all<32>(s, false, workers, q.data(), k.data(), v.data(), mask.data(), out.data(),
                       lse.data(), d_out.data(), d_q.data(), d_k.data(), d_v.data());
    else
      forward_all<32>(s, false, workers, q.data(), k.data(), v.data(), mask.data(), out.data(),
                      lse.data());
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
                              .count());
  }
  // FLOP of the products: forward Q K^T and P V; backward also the recomputed Q K^T, dV, dP, dQ,
  // dK (padding counted, as if skipped blocks were computed).
  const double flop = (backward ? 10.0 : 4.0) * B * H * L * L * D;
  std::printf("%s, %d threads: %.1f ms, %.0f GFLOP/s\n", backward ? "backward" : "forward",
              threads, best * 1e3, flop / best / 1e9);
}
