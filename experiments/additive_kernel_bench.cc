// The native additive attention kernel alone, outside JAX: forward and backward of the seed
// model's shape (batch 32, length 200, 2 heads of 16; lengths 100 + 3 b), 3 x 200 calls each.
//
//   g++ -O3 -march=native -std=c++17 -pthread -fno-math-errno -fno-trapping-math \
//     -fassociative-math -fno-signed-zeros -I "$(python -c 'import jax; print(jax.ffi.include_dir())')" \
//     experiments/additive_kernel_bench.cc -o /tmp/additive_bench && /tmp/additive_bench 1 && /tmp/additive_bench 2
#include "../textattn/native/additive_attention.cc"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>

int main(int argc, char** argv) {
  const int64_t threads = argc > 1 ? std::atoi(argv[1]) : 1;
  const Dims s{32, 200, 2, 16};
  const int64_t F = s.features(), N = s.batch * s.length * F;
  std::mt19937 gen(0);
  std::normal_distribution<float> normal;
  std::vector<float> q(N), k(N), du(N), u(N), dq(N), dk(N), wa(F * 2), wb(F * 2), dwa(F * 2),
      dwb(F * 2);
  for (auto* v : {&q, &k, &du}) for (auto& x : *v) x = normal(gen);
  for (auto* v : {&wa, &wb}) for (auto& x : *v) x = 0.3f * normal(gen);
  std::vector<int32_t> mask(s.batch * s.length);
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t i = 0; i < s.length; ++i) mask[b * s.length + i] = i < 100 + 3 * b;
  std::vector<float> alpha(s.batch * s.length * 2), beta(alpha.size()), gq(s.batch * F),
      gk(s.batch * F);
  using clock = std::chrono::steady_clock;
  for (int rep = 0; rep < 3; ++rep) {
    const auto t0 = clock::now();
    for (int it = 0; it < 200; ++it)
      forward_all<2>(s, threads, q.data(), k.data(), mask.data(), wa.data(), wb.data(), u.data(),
                     alpha.data(), beta.data(), gq.data(), gk.data());
    const auto t1 = clock::now();
    for (int it = 0; it < 200; ++it)
      backward_all<2>(s, threads, q.data(), k.data(), mask.data(), wa.data(), wb.data(),
                      alpha.data(), beta.data(), gq.data(), gk.data(), du.data(), dq.data(),
                      dk.data(), dwa.data(), dwb.data());
    const auto t2 = clock::now();
    std::printf("threads %ld: forward %.3f ms, backward %.3f ms\n", static_cast<long>(threads),
                std::chrono::duration<double, std::milli>(t1 - t0).count() / 200,
                std::chrono::duration<double, std::milli>(t2 - t1).count() / 200);
  }
}
