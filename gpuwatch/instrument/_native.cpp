// gpuwatch's native allocator reader: the CUDA caching allocator's figures in one call.
//
// torch's own bindings (torch._C._cuda_memoryStats) build a nested dict of every counter
// for each read; a phase boundary needs eight numbers. This module reads them straight
// from c10's DeviceAllocator and returns a tuple, and, when gpuwatch resets the peak
// counters, first folds the peaks it is about to reset into a per-device ledger, so that
// the user's own peak queries (wrapped in Python, see _torchmem.py) still see them.
//
// Plain CPython C API (METH_FASTCALL), no pybind11: a call costs little more than a
// Python function call. Every function holds the GIL throughout, as torch's bindings do,
// so the ledgers need no lock of their own.
//
// Built by gpuwatch/instrument/_native.py on a background thread; never imported
// directly by the package.

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <exception>
#include <map>
#include <type_traits>
#include <utility>
#include <vector>

namespace {

using c10::CachingDeviceAllocator::DeviceStats;
using c10::CachingAllocator::Stat;
using c10::CachingAllocator::StatArray;

// The StatArrays of DeviceStats, in the order of their names below; then the two Stats.
constexpr int kArrays = 9;
constexpr int kPools = 3;  // all, small_pool, large_pool (c10's StatType order)
constexpr int kFields = kArrays * kPools + 2;

const char* const kArrayNames[kArrays] = {
    "allocation",     "segment",      "active",
    "inactive_split", "allocated_bytes", "reserved_bytes",
    "active_bytes",   "inactive_split_bytes", "requested_bytes",
};
const char* const kPoolNames[kPools] = {"all", "small_pool", "large_pool"};
const char* const kStatNames[2] = {"oversize_allocations", "oversize_segments"};

const StatArray* array_of(const DeviceStats& s, int i) {
  switch (i) {
    case 0: return &s.allocation;
    case 1: return &s.segment;
    case 2: return &s.active;
    case 3: return &s.inactive_split;
    case 4: return &s.allocated_bytes;
    case 5: return &s.reserved_bytes;
    case 6: return &s.active_bytes;
    case 7: return &s.inactive_split_bytes;
    default: return &s.requested_bytes;
  }
}

using PoolKey = std::pair<unsigned long long, unsigned long long>;

// The peaks gpuwatch has reset away on one device since the user's last reset.
struct Ledger {
  bool any = false;
  std::array<int64_t, kFields> peaks{};
  std::map<PoolKey, std::array<int64_t, kPools>> pools;
};

std::vector<Ledger> ledgers;

// Private pools (CUDA graphs, MemPool) have their own reserved-bytes peaks in newer torch;
// older torch has no such member, and then there is nothing to fold.
template <typename S, typename = void>
struct HasPools : std::false_type {};
template <typename S>
struct HasPools<S, std::void_t<decltype(std::declval<S&>().reserved_bytes_by_private_pools)>>
    : std::true_type {};

template <typename S>
void fold_pools(Ledger& led, const S& s) {
  if constexpr (HasPools<S>::value) {
    for (const auto& [id, arr] : s.reserved_bytes_by_private_pools) {
      auto& slot = led.pools[PoolKey(id.first, id.second)];
      for (int p = 0; p < kPools; ++p) {
        slot[p] = std::max(slot[p], arr[p].peak);
      }
    }
  }
}

void fold(Ledger& led, const DeviceStats& s) {
  for (int i = 0; i < kArrays; ++i) {
    const StatArray& arr = *array_of(s, i);
    for (int p = 0; p < kPools; ++p) {
      auto& slot = led.peaks[i * kPools + p];
      slot = std::max(slot, arr[p].peak);
    }
  }
  auto& a = led.peaks[kArrays * kPools];
  a = std::max(a, s.oversize_allocations.peak);
  auto& b = led.peaks[kArrays * kPools + 1];
  b = std::max(b, s.oversize_segments.peak);
  fold_pools(led, s);
  led.any = true;
}

Ledger& ledger_for(c10::DeviceIndex dev) {
  auto i = static_cast<size_t>(dev);
  if (ledgers.size() <= i) {
    ledgers.resize(i + 1);
  }
  return ledgers[i];
}

c10::DeviceIndex current_device() {
  return c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getDevice().index();
}

// Python's int -> a device index; -1 (or None) means the current device.
bool device_arg(PyObject* obj, c10::DeviceIndex* out) {
  long v = -1;
  if (obj != Py_None) {
    v = PyLong_AsLong(obj);
    if (v == -1 && PyErr_Occurred()) {
      return false;
    }
  }
  if (v < 0) {
    *out = current_device();
  } else if (v > 127) {
    PyErr_SetString(PyExc_ValueError, "device index out of range");
    return false;
  } else {
    *out = static_cast<c10::DeviceIndex>(v);
  }
  return true;
}

PyObject* raise_from(const std::exception& e) {
  // c10's errors carry a C++ backtrace in what(); the first line says what went wrong.
  const auto* err = dynamic_cast<const c10::Error*>(&e);
  PyErr_SetString(PyExc_RuntimeError, err ? err->what_without_backtrace() : e.what());
  return nullptr;
}

// device() -> int: the current CUDA device.
PyObject* py_device(PyObject*, PyObject*) {
  try {
    return PyLong_FromLong(current_device());
  } catch (const std::exception& e) {
    return raise_from(e);
  }
}

// read(device, mode) -> (idx, allocated, reserved, peak allocated, peak reserved,
//                        inactive split bytes, retries, OOMs)
// mode 0: peaks are None; 1: peaks, nothing reset; 2: peaks, then fold them into the
// ledger and reset the allocator's peak counters.
PyObject* py_read(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 2) {
    PyErr_SetString(PyExc_TypeError, "read(device, mode)");
    return nullptr;
  }
  try {
    c10::DeviceIndex dev = 0;
    if (!device_arg(args[0], &dev)) {
      return nullptr;
    }
    long mode = PyLong_AsLong(args[1]);
    if (mode == -1 && PyErr_Occurred()) {
      return nullptr;
    }
    auto* alloc = c10::getDeviceAllocator(c10::kCUDA);
    DeviceStats s = alloc->getDeviceStats(dev);
    if (mode == 2) {
      fold(ledger_for(dev), s);
      alloc->resetPeakStats(dev);
    }
    constexpr auto all = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    PyObject* peak_a = nullptr;
    PyObject* peak_r = nullptr;
    if (mode) {
      peak_a = PyLong_FromLongLong(s.allocated_bytes[all].peak);
      peak_r = PyLong_FromLongLong(s.reserved_bytes[all].peak);
    } else {
      peak_a = Py_NewRef(Py_None);
      peak_r = Py_NewRef(Py_None);
    }
    return Py_BuildValue(
        "(iLLNNLLL)", static_cast<int>(dev),
        static_cast<long long>(s.allocated_bytes[all].current),
        static_cast<long long>(s.reserved_bytes[all].current), peak_a, peak_r,
        static_cast<long long>(s.inactive_split_bytes[all].current),
        static_cast<long long>(s.num_alloc_retries), static_cast<long long>(s.num_ooms));
  } catch (const std::exception& e) {
    return raise_from(e);
  }
}

// ledger(device) -> {path: peak} or None: the peaks gpuwatch reset away since clear().
// A path is the keys down to a stat's dict in torch.cuda.memory_stats_as_nested_dict():
// ("allocated_bytes", "all"), ("oversize_segments",),
// ("reserved_bytes_by_private_pools", (0, 1), "all").
PyObject* py_ledger(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 1) {
    PyErr_SetString(PyExc_TypeError, "ledger(device)");
    return nullptr;
  }
  try {
    c10::DeviceIndex dev = 0;
    if (!device_arg(args[0], &dev)) {
      return nullptr;
    }
    if (static_cast<size_t>(dev) >= ledgers.size() || !ledgers[dev].any) {
      Py_RETURN_NONE;
    }
    const Ledger& led = ledgers[dev];
    PyObject* out = PyDict_New();
    if (!out) {
      return nullptr;
    }
    auto put = [out](PyObject* key, int64_t value) {
      PyObject* v = key ? PyLong_FromLongLong(value) : nullptr;
      int rc = (key && v) ? PyDict_SetItem(out, key, v) : -1;
      Py_XDECREF(key);
      Py_XDECREF(v);
      return rc == 0;
    };
    for (int i = 0; i < kArrays; ++i) {
      for (int p = 0; p < kPools; ++p) {
        if (!put(Py_BuildValue("(ss)", kArrayNames[i], kPoolNames[p]),
                 led.peaks[i * kPools + p])) {
          Py_DECREF(out);
          return nullptr;
        }
      }
    }
    for (int j = 0; j < 2; ++j) {
      if (!put(Py_BuildValue("(s)", kStatNames[j]), led.peaks[kArrays * kPools + j])) {
        Py_DECREF(out);
        return nullptr;
      }
    }
    for (const auto& [id, arr] : led.pools) {
      for (int p = 0; p < kPools; ++p) {
        if (!put(Py_BuildValue("(s(KK)s)", "reserved_bytes_by_private_pools", id.first,
                               id.second, kPoolNames[p]),
                 arr[p])) {
          Py_DECREF(out);
          return nullptr;
        }
      }
    }
    return out;
  } catch (const std::exception& e) {
    return raise_from(e);
  }
}

// clear(device): the user reset the peaks; what gpuwatch reset before no longer counts.
PyObject* py_clear(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 1) {
    PyErr_SetString(PyExc_TypeError, "clear(device)");
    return nullptr;
  }
  try {
    c10::DeviceIndex dev = 0;
    if (!device_arg(args[0], &dev)) {
      return nullptr;
    }
    if (static_cast<size_t>(dev) < ledgers.size()) {
      ledgers[dev] = Ledger();
    }
    Py_RETURN_NONE;
  } catch (const std::exception& e) {
    return raise_from(e);
  }
}

PyMethodDef kMethods[] = {
    {"device", py_device, METH_NOARGS, "The current CUDA device index."},
    {"read", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(py_read)),
     METH_FASTCALL, "read(device, mode) -> the allocator's figures as a tuple."},
    {"ledger", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(py_ledger)),
     METH_FASTCALL, "ledger(device) -> the peaks gpuwatch reset away, or None."},
    {"clear", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(py_clear)),
     METH_FASTCALL, "clear(device): forget the ledger after the user's own reset."},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef kModule = {
    PyModuleDef_HEAD_INIT, "_gpuwatch_native", "gpuwatch's CUDA allocator reader.", -1,
    kMethods,
};

}  // namespace

PyMODINIT_FUNC PyInit__gpuwatch_native() { return PyModule_Create(&kModule); }
