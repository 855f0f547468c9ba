// A stand-in CUDA caching allocator for the CPU build of torch (tests only).
//
// install() registers a c10::DeviceAllocator for DeviceType::CUDA and c10's FakeGuardImpl
// as CUDA's device guard, so that c10::getDeviceAllocator(kCUDA)->getDeviceStats(dev) and
// getDeviceGuardImpl(CUDA)->getDevice() answer in a process without a GPU: gpuwatch's
// native reader runs against it unchanged. The script moves the counters (alloc, free,
// private pools, retries and OOMs); memory_stats(dev) builds the nested dict
// torch._C._cuda_memoryStats builds from the same DeviceStats, and reset_peak(dev) is
// torch._C._cuda_resetPeakMemoryStats.

#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/FakeGuardImpl.h>
#include <pybind11/pybind11.h>

#include <atomic>
#include <map>
#include <mutex>
#include <vector>

namespace py = pybind11;
using c10::CachingAllocator::Stat;
using c10::CachingAllocator::StatArray;
using c10::CachingDeviceAllocator::DeviceStats;

namespace {

constexpr size_t kAll = 0, kSmall = 1, kLarge = 2;
constexpr size_t kMiB = 1 << 20;

struct Standin final : public c10::DeviceAllocator {
  std::vector<DeviceStats> devices{DeviceStats(), DeviceStats()};
  std::mutex mutex;
  std::atomic<int64_t> reads{0};  // getDeviceStats calls (the benchmark's reads count)

  c10::DataPtr allocate(size_t) override {
    return c10::DataPtr(nullptr, c10::Device(c10::DeviceType::CUDA, 0));
  }
  void copy_data(void*, const void*, std::size_t) const override {}
  bool initialized() override { return true; }
  void emptyCache(c10::MempoolId_t) override {}
  void recordStream(const c10::DataPtr&, c10::Stream) override {}
  DeviceStats getDeviceStats(c10::DeviceIndex dev) override {
    std::lock_guard<std::mutex> lock(mutex);
    reads += 1;
    return devices.at(dev);
  }
  void resetAccumulatedStats(c10::DeviceIndex dev) override {
    std::lock_guard<std::mutex> lock(mutex);
    auto& s = devices.at(dev);
    for (auto* arr : arrays(s)) {
      for (auto& st : *arr) st.reset_accumulated();
    }
  }
  void resetPeakStats(c10::DeviceIndex dev) override {
    std::lock_guard<std::mutex> lock(mutex);
    auto& s = devices.at(dev);
    for (auto* arr : arrays(s)) {
      for (auto& st : *arr) st.reset_peak();
    }
    s.oversize_allocations.reset_peak();
    s.oversize_segments.reset_peak();
    for (auto& [id, arr] : s.reserved_bytes_by_private_pools) {
      for (auto& st : arr) st.reset_peak();
    }
  }

  static std::vector<StatArray*> arrays(DeviceStats& s) {
    return {&s.allocation,     &s.segment,        &s.active,
            &s.inactive_split, &s.allocated_bytes, &s.reserved_bytes,
            &s.active_bytes,   &s.inactive_split_bytes, &s.requested_bytes};
  }
};

Standin standin;

void bump(StatArray& arr, size_t pool, int64_t n) {
  if (n >= 0) {
    arr[kAll].increase(n);
    arr[pool].increase(n);
  } else {
    arr[kAll].decrease(-n);
    arr[pool].decrease(-n);
  }
}

void move(int dev, int64_t n) {
  std::lock_guard<std::mutex> lock(standin.mutex);
  auto& s = standin.devices.at(dev);
  size_t size = static_cast<size_t>(n < 0 ? -n : n);
  size_t pool = size < kMiB ? kSmall : kLarge;
  int64_t one = n < 0 ? -1 : 1;
  bump(s.allocation, pool, one);
  bump(s.active, pool, one);
  bump(s.allocated_bytes, pool, n);
  bump(s.active_bytes, pool, n);
  bump(s.requested_bytes, pool, n);
  int64_t short_by = s.allocated_bytes[kAll].current - s.reserved_bytes[kAll].current;
  if (short_by > 0) {
    bump(s.segment, pool, 1);
    bump(s.reserved_bytes, pool, std::max<int64_t>(short_by, 2 * kMiB));
  }
  if (size >= 64 * kMiB) {
    if (n > 0) {
      s.oversize_allocations.increase(1);
    } else {
      s.oversize_allocations.decrease(1);
    }
  }
}

py::dict stat_dict(const Stat& st) {
  py::dict d;
  d["current"] = st.current;
  d["peak"] = st.peak;
  d["allocated"] = st.allocated;
  d["freed"] = st.freed;
  return d;
}

py::dict array_dict(const StatArray& arr) {
  py::dict d;
  d["all"] = stat_dict(arr[kAll]);
  d["small_pool"] = stat_dict(arr[kSmall]);
  d["large_pool"] = stat_dict(arr[kLarge]);
  return d;
}

py::dict memory_stats(int dev) {
  DeviceStats s = standin.getDeviceStats(dev);
  py::dict out;
  out["num_alloc_retries"] = s.num_alloc_retries;
  out["num_ooms"] = s.num_ooms;
  out["max_split_size"] = s.max_split_size;
  out["oversize_allocations"] = stat_dict(s.oversize_allocations);
  out["oversize_segments"] = stat_dict(s.oversize_segments);
  out["num_sync_all_streams"] = s.num_sync_all_streams;
  out["num_device_alloc"] = s.num_device_alloc;
  out["num_device_free"] = s.num_device_free;
  out["allocation"] = array_dict(s.allocation);
  out["segment"] = array_dict(s.segment);
  out["active"] = array_dict(s.active);
  out["inactive_split"] = array_dict(s.inactive_split);
  out["allocated_bytes"] = array_dict(s.allocated_bytes);
  out["reserved_bytes"] = array_dict(s.reserved_bytes);
  out["active_bytes"] = array_dict(s.active_bytes);
  out["inactive_split_bytes"] = array_dict(s.inactive_split_bytes);
  out["requested_bytes"] = array_dict(s.requested_bytes);
  py::dict pools;
  for (const auto& [id, arr] : s.reserved_bytes_by_private_pools) {
    pools[py::make_tuple(id.first, id.second)] = array_dict(arr);
  }
  out["reserved_bytes_by_private_pools"] = pools;
  return out;
}

using Guard = c10::impl::FakeGuardImpl<c10::DeviceType::CUDA>;

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("install", []() {
    c10::SetAllocator(c10::DeviceType::CUDA, &standin, 255);
    if (!c10::impl::hasDeviceGuardImpl(c10::DeviceType::CUDA)) {
      c10::impl::registerDeviceGuard(c10::DeviceType::CUDA, new Guard());
    }
  });
  m.def("set_device", [](int dev) { Guard::setDeviceIndex(static_cast<c10::DeviceIndex>(dev)); });
  m.def("get_device", []() { return static_cast<int>(Guard::getDeviceIndex()); });
  m.def("alloc", [](int dev, int64_t n) { move(dev, n); });
  m.def("free", [](int dev, int64_t n) { move(dev, -n); });
  m.def("private_pool", [](int dev, uint64_t a, uint64_t b, int64_t n) {
    std::lock_guard<std::mutex> lock(standin.mutex);
    auto& arr = standin.devices.at(dev).reserved_bytes_by_private_pools[{a, b}];
    bump(arr, kLarge, n);
  });
  m.def("set_counters", [](int dev, int64_t retries, int64_t ooms, int64_t split) {
    std::lock_guard<std::mutex> lock(standin.mutex);
    auto& s = standin.devices.at(dev);
    s.num_alloc_retries = retries;
    s.num_ooms = ooms;
    int64_t d = split - s.inactive_split_bytes[kAll].current;
    bump(s.inactive_split_bytes, kLarge, d);
  });
  m.def("clear", []() {
    std::lock_guard<std::mutex> lock(standin.mutex);
    standin.devices.assign(2, DeviceStats());
  });
  m.def("memory_stats", &memory_stats);
  m.def("reads", []() { return static_cast<int64_t>(standin.reads.load()); });
  m.def("reset_peak", [](int dev) { standin.resetPeakStats(dev); });
}
