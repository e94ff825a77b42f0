// Times textattn's native softmax attention kernel alone (no JAX, no XLA): forward and
// backward of the seed model's shape (batch 32, length 200, 2 heads of 16, no padding), one
// thread, 3 rounds of 20 calls. Build and run from the repository root:
//
//   g++ -O3 -march=native -std=c++17 -pthread -fno-math-errno -fno-trapping-math \
//     -fassociative-math -fno-signed-zeros -I "$(python -c 'import jax; print(jax.ffi.include_dir())')" \
//     experiments/native_kernel_bench.cc -o /tmp/native_kernel_bench && /tmp/native_kernel_bench
//
// (the flags textattn/native.py compiles the kernel with). Results: experiments/RESULTS.md.
#include "../textattn/native/softmax_attention.cc"

#include <chrono>
#include <cstdio>
#include <random>

int main() {
  Shape s{32, 200, 2, 16};
  const size_t n = s.batch * s.length * s.heads * s.dim;
  std::vector<float> q(n), k(n), v(n), out(n), dq(n), dk(n), dv(n);
  std::vector<float> probs(s.batch * s.heads * s.length * s.length);
  std::vector<int32_t> mask(s.batch * s.length, 1);
  std::mt19937 gen(0);
  std::normal_distribution<float> normal;
  for (size_t i = 0; i < n; ++i) {
    q[i] = normal(gen);
    k[i] = normal(gen);
    v[i] = normal(gen);
  }
  using clock = std::chrono::steady_clock;
  for (int round = 0; round < 3; ++round) {
    const auto t0 = clock::now();
    for (int it = 0; it < 20; ++it)
      forward_all<16>(s, false, 1, q.data(), k.data(), v.data(), mask.data(), out.data(),
                      probs.data());
    const auto t1 = clock::now();
    for (int it = 0; it < 20; ++it)
      backward_all<16>(s, false, 1, q.data(), k.data(), v.data(), mask.data(), out.data(),
                       probs.data(), out.data(), dq.data(), dk.data(), dv.data());
    const auto t2 = clock::now();
    std::printf("forward %.2f ms, backward %.2f ms\n",
                std::chrono::duration<double, std::milli>(t1 - t0).count() / 20,
                std::chrono::duration<double, std::milli>(t2 - t1).count() / 20);
  }
}
