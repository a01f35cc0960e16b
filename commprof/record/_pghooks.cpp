// commprof's native process-group hooks: DDP's bucket allreduces timed in
// C++, with no Python (and no GIL) per bucket.
//
// A pre-hook takes the issue time (CLOCK_MONOTONIC, as time.monotonic_ns),
// the bytes, the dtype and the group's next sequence number; the post-hook
// puts a C++ callback on the work's future that takes the completion time
// on the backend's thread. Rows wait in a buffer that the journal writer
// drains (drain()) at each flush. Every issue is also written, before the
// call enters the backend, into the crash-proof collective ring (a
// memory-mapped file, layout in commprof/trace/ring.py) when one is set,
// and its completion time when it completes. Built once per torch version
// by commprof.record.native; loaded only where it was built.
#include <torch/extension.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <execinfo.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

int64_t mono_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

// collectives issued from Python's torch.distributed API are timed there:
// the collectives instrument raises this around its calls
thread_local int suppressed = 0;
std::atomic<int64_t> current_step{0};

// -- the collective ring (commprof/trace/ring.py: HEADER_SIZE, SLOT, SLOT_SIZE)
#pragma pack(push, 1)
struct RingSlot {
  uint64_t index;
  int64_t t_issue, t_done, nbytes, seq;
  int32_t step, group_size;
  char op[16], group[16], dtype[16], source[24];
};
#pragma pack(pop)
static_assert(sizeof(RingSlot) == 120, "ring slot layout");
constexpr int64_t kRingHeader = 64, kRingSlotSize = 128;

std::atomic<char*> ring_base{nullptr};  // set_ring
int64_t ring_slots = 0;
std::atomic<uint64_t> ring_n{0};

template <size_t N>
void copy_text(char (&dst)[N], const std::string& s) {
  std::memset(dst, 0, N);
  std::memcpy(dst, s.data(), s.size() < N ? s.size() : N);
}

// -- a C++ exception that ends the process (a backend thread throwing): its
// message into the fatal report (record/forensics.py) before the abort
int terminate_fd = -1;
std::terminate_handler previous_terminate = nullptr;

void on_terminate() {
  if (terminate_fd >= 0) {
    std::string msg = "commprof terminate: ";  // trace/ends.py TERMINATE_PREFIX
    if (auto ep = std::current_exception()) {
      try {
        std::rethrow_exception(ep);
      } catch (const std::exception& e) {
        msg += e.what();
      } catch (...) {
        msg += "an exception that is not a std::exception";
      }
    } else {
      msg += "std::terminate without an exception";
    }
    for (auto& c : msg) {
      if (c == '\n') {
        c = ' ';
      }
    }
    msg += "\ncommprof native stack:\n";  // the C-level stack of the thread that terminates
    ssize_t n = write(terminate_fd, msg.data(), msg.size());
    void* frames[48];
    int depth = backtrace(frames, 48);
    backtrace_symbols_fd(frames, depth, terminate_fd);
    const char end[] = "commprof native stack end\n";
    n = write(terminate_fd, end, sizeof(end) - 1);
    (void)n;
  }
  if (previous_terminate != nullptr) {
    previous_terminate();
  }
  std::abort();
}

struct Row {
  int64_t t0 = 0, t1 = 0, nbytes = 0, seq = 0, step = 0;
  int32_t dtype = -1;
  RingSlot* slot = nullptr;
  uint64_t index = 0;
};

// issue: index 0, the fields, then the index (a torn slot reads as empty)
void ring_issue(Row& r, const std::string& group, int32_t group_size, const std::string& dtype) {
  char* base = ring_base.load(std::memory_order_acquire);
  if (base == nullptr) {
    return;
  }
  uint64_t i = ring_n.fetch_add(1) + 1;
  auto* s = reinterpret_cast<RingSlot*>(base + kRingHeader + ((i - 1) % ring_slots) * kRingSlotSize);
  __atomic_store_n(&s->index, 0, __ATOMIC_RELEASE);
  s->t_issue = r.t0;
  s->t_done = 0;
  s->nbytes = r.nbytes;
  s->seq = r.seq;
  s->step = static_cast<int32_t>(r.step);
  s->group_size = group_size;
  copy_text(s->op, "all_reduce");
  copy_text(s->group, group);
  copy_text(s->dtype, dtype);
  copy_text(s->source, "ddp_reducer");
  __atomic_store_n(&s->index, i, __ATOMIC_RELEASE);
  r.slot = s;
  r.index = i;
}

void ring_done(const Row& r) {
  if (r.slot != nullptr && __atomic_load_n(&r.slot->index, __ATOMIC_ACQUIRE) == r.index) {
    r.slot->t_done = r.t1;
  }
}

struct State {
  std::mutex mu;
  int64_t next_seq = 0;
  int64_t last_issue = 0;
  std::unordered_map<int64_t, Row> issued;  // op_id -> row, until the post-hook
  int64_t awaiting = 0;                      // past the post-hook, completion not yet in `done`
  std::vector<Row> done;
  std::atomic<bool> enabled{true};
  std::string group;                                // for the ring
  int32_t group_size = 0;
  std::unordered_map<int32_t, std::string> dtypes;  // scalar type code -> torch dtype name
};

class GroupHooks {
 public:
  GroupHooks(const c10::intrusive_ptr<c10d::ProcessGroup>& pg, int64_t hook_id, int64_t first_seq)
      : pg_(pg), id_(hook_id), st_(std::make_shared<State>()) {
    st_->next_seq = first_seq;
    std::shared_ptr<State> st = st_;
    pg->registerPreHook(id_, [st](const c10d::PreHookArgs& a) {
      if (a.name != c10d::HookOpName::ALLREDUCE || suppressed || !st->enabled.load(std::memory_order_relaxed)) {
        return;
      }
      Row r;
      r.t0 = mono_ns();
      for (const auto& t : a.input_tensors) {
        r.nbytes += static_cast<int64_t>(t.nbytes());
      }
      if (!a.input_tensors.empty()) {
        r.dtype = static_cast<int32_t>(a.input_tensors[0].scalar_type());
      }
      r.step = current_step.load(std::memory_order_relaxed);
      std::lock_guard<std::mutex> g(st->mu);
      r.seq = st->next_seq++;
      st->last_issue = r.t0;
      if (ring_base.load(std::memory_order_relaxed) != nullptr) {
        auto d = st->dtypes.find(r.dtype);
        ring_issue(r, st->group, st->group_size, d == st->dtypes.end() ? std::string() : d->second);
      }
      st->issued[a.op_id] = r;
    });
    pg->registerPostHook(id_, [st](const c10d::PostHookArgs& a) {
      Row r;
      {
        std::lock_guard<std::mutex> g(st->mu);
        auto it = st->issued.find(a.op_id);
        if (it == st->issued.end()) {
          return;
        }
        r = it->second;
        st->issued.erase(it);
        st->awaiting++;  // in flight until its completion is in `done`
      }
      c10::intrusive_ptr<c10::ivalue::Future> fut;
      try {
        if (a.work) {
          fut = a.work->getFuture();
        }
      } catch (...) {
        fut.reset();
      }
      if (!fut) {  // synchronous, or no future: complete when it returned
        r.t1 = mono_ns();
        ring_done(r);
        std::lock_guard<std::mutex> g(st->mu);
        st->done.push_back(r);
        st->awaiting--;
        return;
      }
      // registered from inside the issuing call, before the Reducer chains
      // its own callback: it runs first, on the backend's thread
      fut->addCallback([st, r](c10::ivalue::Future&) mutable {
        r.t1 = mono_ns();
        ring_done(r);
        std::lock_guard<std::mutex> g(st->mu);
        st->done.push_back(r);
        st->awaiting--;
      });
    });
  }

  ~GroupHooks() { remove(); }

  void remove() {
    if (removed_) {
      return;
    }
    removed_ = true;
    auto pg = pg_.lock();
    if (pg) {
      pg->unregisterPreHook(id_);
      pg->unregisterPostHook(id_);
    }
  }

  // (t0, t1, bytes, dtype code, seq, step) of every completed collective since the last call
  std::vector<std::tuple<int64_t, int64_t, int64_t, int32_t, int64_t, int64_t>> drain() {
    std::vector<Row> rows;
    {
      std::lock_guard<std::mutex> g(st_->mu);
      rows.swap(st_->done);
    }
    std::vector<std::tuple<int64_t, int64_t, int64_t, int32_t, int64_t, int64_t>> out;
    out.reserve(rows.size());
    for (const auto& r : rows) {
      out.emplace_back(r.t0, r.t1, r.nbytes, r.dtype, r.seq, r.step);
    }
    return out;
  }

  int64_t next_seq() {
    std::lock_guard<std::mutex> g(st_->mu);
    return st_->next_seq++;
  }

  int64_t last_issue() {
    std::lock_guard<std::mutex> g(st_->mu);
    return st_->last_issue;
  }

  // issued and not yet in the buffer (before the post-hook, or waiting for its future)
  size_t in_flight() {
    std::lock_guard<std::mutex> g(st_->mu);
    return st_->issued.size() + static_cast<size_t>(st_->awaiting);
  }

  void set_enabled(bool on) { st_->enabled.store(on); }

  void set_ring_info(const std::string& group, int32_t group_size,
                     const std::unordered_map<int32_t, std::string>& dtypes) {
    std::lock_guard<std::mutex> g(st_->mu);
    st_->group = group;
    st_->group_size = group_size;
    st_->dtypes = dtypes;
  }

 private:
  c10::weak_intrusive_ptr<c10d::ProcessGroup> pg_;
  int64_t id_;
  std::shared_ptr<State> st_;
  bool removed_ = false;
};

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "commprof's native process-group hooks (DDP buckets timed without Python)";
  py::class_<GroupHooks>(m, "GroupHooks")
      .def(py::init<const c10::intrusive_ptr<c10d::ProcessGroup>&, int64_t, int64_t>(), py::arg("pg"),
           py::arg("hook_id"), py::arg("first_seq"))
      .def("remove", &GroupHooks::remove)
      .def("drain", &GroupHooks::drain)
      .def("next_seq", &GroupHooks::next_seq)
      .def("last_issue", &GroupHooks::last_issue)
      .def("in_flight", &GroupHooks::in_flight)
      .def("set_enabled", &GroupHooks::set_enabled)
      .def("set_ring_info", &GroupHooks::set_ring_info);
  // the ring's mapping (kept alive by the caller for the process's life;
  // a forked child that records sets its own; 0: no ring from now on)
  m.def("set_ring", [](uintptr_t addr, int64_t slots) {
    ring_base.store(nullptr);
    if (addr != 0 && slots > 0) {
      ring_slots = slots;
      ring_base.store(reinterpret_cast<char*>(addr), std::memory_order_release);
    }
  });
  m.def("set_terminate_fd", [](int fd) {
    terminate_fd = fd;
    if (previous_terminate == nullptr) {
      previous_terminate = std::set_terminate(on_terminate);
    }
  });
  m.def("set_step", [](int64_t step) { current_step.store(step, std::memory_order_relaxed); });
  m.def("suppress", [](bool on) { suppressed += on ? 1 : -1; });
  m.def("scalar_type_code", [](const at::Tensor& t) { return static_cast<int32_t>(t.scalar_type()); });
}
