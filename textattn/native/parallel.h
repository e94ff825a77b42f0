// for_each_task: run body(worker, task) for task = 0 .. count-1 on up to `threads` std::threads,
// task t on worker t % threads (so which thread computes a task never depends on timing).
// Exception-safe: if starting a thread fails, or a task throws (e.g. std::bad_alloc from a
// scratch buffer), every started thread is joined and the first exception is rethrown in the
// caller, which turns it into an XLA FFI error; an exception never reaches std::terminate.
#ifndef TEXTATTN_NATIVE_PARALLEL_H_
#define TEXTATTN_NATIVE_PARALLEL_H_

#include <algorithm>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace textattn {

template <typename Body>
void for_each_task(int64_t count, int64_t threads, Body body) {
  threads = std::max<int64_t>(1, std::min<int64_t>(threads, count));
  std::exception_ptr error;
  std::mutex error_mutex;
  auto run = [&](int64_t worker) {
    try {
      for (int64_t task = worker; task < count; task += threads) body(worker, task);
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex);
      if (!error) error = std::current_exception();
    }
  };
  std::vector<std::thread> pool;
  try {
    for (int64_t worker = 1; worker < threads; ++worker) pool.emplace_back(run, worker);
  } catch (...) {
    for (auto& thread : pool) thread.join();
    throw;
  }
  run(0);
  for (auto& thread : pool) thread.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace textattn

#endif  // TEXTATTN_NATIVE_PARALLEL_H_
