// y[M, N] = x[M, K] @ w, float32, with w packed in column panels: [N / P, K, P] (P = 32
// columns a panel, each panel's K rows contiguous). An XLA FFI handler for XLA:CPU's
// decode steps, where a few rows multiply weights that stream from memory: every panel is
// read once, front to back, and multiplied into up to 8 rows at a time held in registers
// (2 vectors of 16 floats a row), with the panels shared out over XLA's intra-op threads.
// Built and loaded by c2jax_kernels.cpu_matmul (see __init__.py there).

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr int64_t kPanel = 32;
constexpr int64_t kRows = 8;  // rows a block keeps in registers
typedef float Vec16 __attribute__((vector_size(64)));

// Rows r0 .. r0 + R of y's columns [panel * P, panel * P + P).
template <int R>
void Block(const float* x, int64_t k_size, const float* panel, float* y, int64_t n_size) {
  Vec16 acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = Vec16{};
  for (int64_t k = 0; k < k_size; ++k) {
    Vec16 w0, w1;
    std::memcpy(&w0, panel + k * kPanel, sizeof(Vec16));
    std::memcpy(&w1, panel + k * kPanel + 16, sizeof(Vec16));
    for (int r = 0; r < R; ++r) {
      const float b = x[r * k_size + k];
      acc[r][0] += b * w0;
      acc[r][1] += b * w1;
    }
  }
  for (int r = 0; r < R; ++r) {
    std::memcpy(y + r * n_size, &acc[r][0], sizeof(Vec16));
    std::memcpy(y + r * n_size + 16, &acc[r][1], sizeof(Vec16));
  }
}

void Panels(const float* x, int64_t m_size, int64_t k_size, const float* w, float* y,
            int64_t n_size, int64_t first, int64_t last) {
  for (int64_t p = first; p < last; ++p) {
    const float* panel = w + p * k_size * kPanel;
    for (int64_t r = 0; r < m_size; r += kRows) {
      const float* xr = x + r * k_size;
      float* yr = y + r * n_size + p * kPanel;
      switch (m_size - r < kRows ? m_size - r : kRows) {
        case 1: Block<1>(xr, k_size, panel, yr, n_size); break;
        case 2: Block<2>(xr, k_size, panel, yr, n_size); break;
        case 3: Block<3>(xr, k_size, panel, yr, n_size); break;
        case 4: Block<4>(xr, k_size, panel, yr, n_size); break;
        case 5: Block<5>(xr, k_size, panel, yr, n_size); break;
        case 6: Block<6>(xr, k_size, panel, yr, n_size); break;
        case 7: Block<7>(xr, k_size, panel, yr, n_size); break;
        default: Block<8>(xr, k_size, panel, yr, n_size); break;
      }
    }
  }
}

// Chunks of panels claimed from a shared counter by the calling thread and by tasks on
// XLA's pool. The caller never waits for a task to start (the pool's threads may all be
// busy, or waiting themselves), only for chunks already claimed to finish; a task that
// starts late finds nothing left and returns.
struct Progress {
  std::atomic<int64_t> next{0}, done{0};
  std::mutex mu;
  std::condition_variable finished;
};

ffi::Error PanelMatmul(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x,
                       ffi::Buffer<ffi::F32> w, ffi::ResultBuffer<ffi::F32> y) {
  const auto xd = x.dimensions(), wd = w.dimensions(), yd = y->dimensions();
  if (xd.size() != 2 || wd.size() != 3 || yd.size() != 2 || wd[2] != kPanel ||
      wd[1] != xd[1] || yd[0] != xd[0] || yd[1] != wd[0] * kPanel) {
    return ffi::Error::InvalidArgument(
        "c2jax_panel_matmul: want x [M, K], w [N / 32, K, 32] and y [M, N]");
  }
  const int64_t m_size = xd[0], k_size = xd[1], panels = wd[0], n_size = panels * kPanel;
  const float* xp = x.typed_data();
  const float* wp = w.typed_data();
  float* yp = y->typed_data();
  const int64_t threads = pool.num_threads();
  const int64_t chunks = panels < 4 * (threads + 1) ? panels : 4 * (threads + 1);
  if (threads <= 0 || chunks <= 1 || m_size == 0) {
    Panels(xp, m_size, k_size, wp, yp, n_size, 0, panels);
    return ffi::Error::Success();
  }
  auto progress = std::make_shared<Progress>();
  auto work = [=] {
    for (int64_t c; (c = progress->next.fetch_add(1)) < chunks;) {
      Panels(xp, m_size, k_size, wp, yp, n_size, panels * c / chunks,
             panels * (c + 1) / chunks);
      if (progress->done.fetch_add(1) + 1 == chunks) {
        std::lock_guard<std::mutex> lock(progress->mu);
        progress->finished.notify_all();
      }
    }
  };
  for (int64_t t = 0; t < threads; ++t) {
    auto task = work;
    pool.Schedule(std::move(task));
  }
  work();
  std::unique_lock<std::mutex> lock(progress->mu);
  progress->finished.wait(lock, [&] { return progress->done.load() == chunks; });
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(c2jax_panel_matmul, PanelMatmul,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
