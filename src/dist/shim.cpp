// The only C++ of lego-rl: a narrow extern "C" surface over libtorch's own c10d (TCPStore,
// ProcessGroupGloo; ProcessGroupNCCL when built with the `nccl` feature), used by src/dist/ffi.rs.
//
// Rules of this surface: plain integers and strings in, `at::Tensor*` (tch's Tensor::as_ptr())
// for tensors, 0 for success, and on failure a malloc'ed message in *err (freed with
// lr_dist_free_string). No C++ exception crosses it. Every collective waits for its work with a
// timeout, so a dead or hung peer turns into an error instead of a hang.
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#ifdef LEGO_RL_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

namespace {

struct Group {
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::Backend> backend;
};

char* dup(const std::string& s) {
  char* out = static_cast<char*>(std::malloc(s.size() + 1));
  if (out != nullptr) {
    std::memcpy(out, s.c_str(), s.size() + 1);
  }
  return out;
}

// Runs `f`, turning any exception into a message in *err and a return of 1.
template <typename F>
int guarded(char** err, F&& f) {
  try {
    f();
    return 0;
  } catch (const c10::Error& e) {
    // what() carries a C++ backtrace; the message without it is what a user needs.
    *err = dup(e.what_without_backtrace());
  } catch (const std::exception& e) {
    *err = dup(e.what());
  } catch (...) {
    *err = dup("unknown C++ exception");
  }
  return 1;
}

void wait(const c10::intrusive_ptr<c10d::Work>& work, int64_t timeout_ms) {
  if (!work->wait(std::chrono::milliseconds(timeout_ms))) {
    throw std::runtime_error("timed out");
  }
}

c10d::ReduceOp reduce_op(int op) {
  switch (op) {
    case 0:
      return c10d::ReduceOp(c10d::ReduceOp::SUM);
    case 1:
      return c10d::ReduceOp(c10d::ReduceOp::MAX);
    case 2:
      return c10d::ReduceOp(c10d::ReduceOp::MIN);
    case 3:
      return c10d::ReduceOp(c10d::ReduceOp::PRODUCT);
    default:
      throw std::invalid_argument("unknown reduce op " + std::to_string(op));
  }
}

at::Tensor& tensor(void* t) {
  return *static_cast<at::Tensor*>(t);
}

} // namespace

extern "C" {

void lr_dist_free_string(char* s) {
  std::free(s);
}

// Rendezvous through a TCPStore at host:port (rank 0 serves it) and builds the backend:
// backend 0 = Gloo (`gloo_iface` non-empty: that network interface; `gloo_host` non-empty: the
// address of that host name; neither: Gloo's default device), 1 = NCCL.
void* lr_dist_init(
    int backend,
    const char* host,
    int port,
    int rank,
    int world_size,
    int64_t timeout_ms,
    const char* gloo_iface,
    const char* gloo_host,
    char** err) {
  Group* group = nullptr;
  int rc = guarded(err, [&] {
    auto timeout = std::chrono::milliseconds(timeout_ms);
    c10d::TCPStoreOptions opts;
    opts.port = static_cast<std::uint16_t>(port);
    opts.isServer = rank == 0;
    opts.numWorkers = static_cast<std::size_t>(world_size);
    opts.waitWorkers = true;
    opts.timeout = timeout;
    auto store = c10::make_intrusive<c10d::TCPStore>(std::string(host), opts);
    c10::intrusive_ptr<c10d::Backend> pg;
    if (backend == 0) {
      auto o = c10d::ProcessGroupGloo::Options::create(timeout);
      if (gloo_iface != nullptr && gloo_iface[0] != '\0') {
        o->devices.push_back(
            c10d::ProcessGroupGloo::createDeviceForInterface(gloo_iface));
      } else if (gloo_host != nullptr && gloo_host[0] != '\0') {
        o->devices.push_back(
            c10d::ProcessGroupGloo::createDeviceForHostname(gloo_host));
      } else {
        o->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
      }
      pg = c10::make_intrusive<c10d::ProcessGroupGloo>(
          store, rank, world_size, o);
    } else if (backend == 1) {
#ifdef LEGO_RL_NCCL
      auto o = c10d::ProcessGroupNCCL::Options::create();
      o->timeout = timeout;
      pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(
          store, rank, world_size, o);
#else
      throw std::runtime_error(
          "this lego-rl was built without NCCL (cargo feature `nccl`)");
#endif
    } else {
      throw std::invalid_argument("unknown backend " + std::to_string(backend));
    }
    group = new Group{store, pg};
  });
  return rc == 0 ? group : nullptr;
}

void lr_dist_free(void* group) {
  delete static_cast<Group*>(group);
}

int lr_dist_all_reduce(void* g, void* t, int op, int64_t timeout_ms, char** err) {
  return guarded(err, [&] {
    std::vector<at::Tensor> ts{tensor(t)};
    c10d::AllreduceOptions o;
    o.reduceOp = reduce_op(op);
    o.timeout = std::chrono::milliseconds(timeout_ms);
    wait(static_cast<Group*>(g)->backend->allreduce(ts, o), timeout_ms);
  });
}

int lr_dist_broadcast(void* g, void* t, int root, int64_t timeout_ms, char** err) {
  return guarded(err, [&] {
    std::vector<at::Tensor> ts{tensor(t)};
    c10d::BroadcastOptions o;
    o.rootRank = root;
    o.timeout = std::chrono::milliseconds(timeout_ms);
    wait(static_cast<Group*>(g)->backend->broadcast(ts, o), timeout_ms);
  });
}

// `out` holds world_size × numel(input), rank r's input at block r.
int lr_dist_all_gather(void* g, void* out, void* in, int64_t timeout_ms, char** err) {
  return guarded(err, [&] {
    c10d::AllgatherOptions o;
    o.timeout = std::chrono::milliseconds(timeout_ms);
    wait(
        static_cast<Group*>(g)->backend->_allgather_base(
            tensor(out), tensor(in), o),
        timeout_ms);
  });
}

// `in` holds world_size × numel(out); rank r receives the reduction of every rank's block r.
int lr_dist_reduce_scatter(
    void* g, void* out, void* in, int op, int64_t timeout_ms, char** err) {
  return guarded(err, [&] {
    c10d::ReduceScatterOptions o;
    o.reduceOp = reduce_op(op);
    o.timeout = std::chrono::milliseconds(timeout_ms);
    wait(
        static_cast<Group*>(g)->backend->_reduce_scatter_base(
            tensor(out), tensor(in), o),
        timeout_ms);
  });
}

// Equal splits along dim 0: block j of `in` goes to rank j, block i of `out` comes from rank i.
int lr_dist_all_to_all(void* g, void* out, void* in, int64_t timeout_ms, char** err) {
  return guarded(err, [&] {
    c10d::AllToAllOptions o;
    o.timeout = std::chrono::milliseconds(timeout_ms);
    std::vector<int64_t> splits;
    wait(
        static_cast<Group*>(g)->backend->alltoall_base(
            tensor(out), tensor(in), splits, splits, o),
        timeout_ms);
  });
}

int lr_dist_barrier(void* g, int64_t timeout_ms, char** err) {
  return guarded(err, [&] {
    c10d::BarrierOptions o;
    o.timeout = std::chrono::milliseconds(timeout_ms);
    wait(static_cast<Group*>(g)->backend->barrier(o), timeout_ms);
  });
}

} // extern "C"
