// The only C++ of lego-rl: a narrow extern "C" surface over libtorch's own c10d (TCPStore,
// ProcessGroupGloo; ProcessGroupNCCL when built with the `nccl` feature), used by src/c10d/ffi.rs.
//
// Rules of this surface: plain integers and strings in, `at::Tensor*` (tch's Tensor::as_ptr())
// for tensors, 0 for success, and on failure a malloc'ed message in *err (freed with
// lr_dist_free_string). No C++ exception crosses it. Every collective waits for its work with a
// timeout, so a dead or hung peer turns into an error instead of a hang. Once a collective of a
// group failed, the group is poisoned: every later call on it fails at once with the first error
// (a rank must not wait a whole timeout per remaining collective, e.g. per MoE layer of a
// backward, after its peer died).
//
// Expert parallelism adds sub-groups (a PrefixStore over the same TCPStore and a new backend of
// the subset), all_to_all with uneven splits, and a differentiable all_to_all (an autograd
// Function whose backward is the reverse exchange, as torch.distributed.nn.functional.all_to_all).
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <numeric>
#include <string>
#include <vector>

#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#ifdef LEGO_RL_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

namespace {

struct Group {
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::Backend> backend;
  // What sub-groups are built with: backend 0 = Gloo (on these devices), 1 = NCCL.
  int kind = 0;
  std::vector<std::shared_ptr<::gloo::transport::Device>> devices;
  std::chrono::milliseconds timeout{0};
  // The first failure of a collective of this group ("" while healthy).
  std::mutex mu;
  std::string poisoned;
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

// Runs collective `f` of group `g`: fails at once when the group is poisoned, and poisons it
// when `f` throws.
template <typename F>
void on_group(Group* g, F&& f) {
  {
    std::lock_guard<std::mutex> lock(g->mu);
    if (!g->poisoned.empty()) {
      throw std::runtime_error(
          "an earlier collective of this group failed: " + g->poisoned);
    }
  }
  try {
    f();
  } catch (const c10::Error& e) {
    std::lock_guard<std::mutex> lock(g->mu);
    g->poisoned = e.what_without_backtrace();
    throw;
  } catch (const std::exception& e) {
    std::lock_guard<std::mutex> lock(g->mu);
    g->poisoned = e.what();
    throw;
  }
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

// Rows `in_splits[j]` of `input` (dim 0) go to rank j; the result holds `out_splits[i]` rows from
// rank i, in rank order.
at::Tensor exchange(
    Group* g,
    const at::Tensor& input,
    std::vector<int64_t> out_splits,
    std::vector<int64_t> in_splits,
    int64_t timeout_ms) {
  auto in = input.contiguous();
  auto sizes = in.sizes().vec();
  sizes[0] = std::accumulate(out_splits.begin(), out_splits.end(), int64_t{0});
  auto out = at::empty(sizes, in.options());
  on_group(g, [&] {
    c10d::AllToAllOptions o;
    o.timeout = std::chrono::milliseconds(timeout_ms);
    wait(g->backend->alltoall_base(out, in, out_splits, in_splits, o), timeout_ms);
  });
  return out;
}

// all_to_all as an autograd node: the backward sends each gradient row back to the rank its
// input row came from (the same exchange with the splits swapped).
struct AllToAll : public torch::autograd::Function<AllToAll> {
  static at::Tensor forward(
      torch::autograd::AutogradContext* ctx,
      const at::Tensor& input,
      int64_t group,
      std::vector<int64_t> out_splits,
      std::vector<int64_t> in_splits,
      int64_t timeout_ms) {
    ctx->saved_data["group"] = group;
    ctx->saved_data["out_splits"] = out_splits;
    ctx->saved_data["in_splits"] = in_splits;
    ctx->saved_data["timeout_ms"] = timeout_ms;
    ctx->saved_data["in_sizes"] = input.sizes().vec();
    // dtype and device of a zero gradient, should the output's be undefined.
    ctx->saved_data["like"] = at::empty({0}, input.options());
    return exchange(
        reinterpret_cast<Group*>(group), input, out_splits, in_splits, timeout_ms);
  }

  static torch::autograd::variable_list backward(
      torch::autograd::AutogradContext* ctx,
      torch::autograd::variable_list grads) {
    auto* g = reinterpret_cast<Group*>(ctx->saved_data["group"].toInt());
    auto out_splits = ctx->saved_data["out_splits"].toIntVector();
    auto in_splits = ctx->saved_data["in_splits"].toIntVector();
    auto timeout_ms = ctx->saved_data["timeout_ms"].toInt();
    at::Tensor grad = grads[0];
    if (!grad.defined()) {
      // Every rank must take part in the exchange, even with nothing to send.
      auto sizes = ctx->saved_data["in_sizes"].toIntVector();
      sizes[0] = std::accumulate(out_splits.begin(), out_splits.end(), int64_t{0});
      grad = at::zeros(sizes, ctx->saved_data["like"].toTensor().options());
    }
    auto back = exchange(g, grad, in_splits, out_splits, timeout_ms);
    return {back, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

std::vector<int64_t> splits(const int64_t* p, int64_t n) {
  return std::vector<int64_t>(p, p + n);
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
    std::vector<std::shared_ptr<::gloo::transport::Device>> devices;
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
      devices = o->devices;
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
          "this lego-rl was built without NCCL (no CUDA torch wheel or CUDA headers at build time; scripts/setup.sh fetches them)");
#endif
    } else {
      throw std::invalid_argument("unknown backend " + std::to_string(backend));
    }
    group = new Group();
    group->store = store;
    group->backend = pg;
    group->kind = backend;
    group->devices = devices;
    group->timeout = timeout;
  });
  return rc == 0 ? group : nullptr;
}

// A group of `n` ranks of `parent` (`ranks`, ascending, parent ranks; this rank at `index`),
// rendezvousing under `tag` in the parent's store. Only the members call this, each once.
void* lr_dist_subgroup(
    void* parent, const char* tag, int index, int n, char** err) {
  Group* group = nullptr;
  int rc = guarded(err, [&] {
    auto* p = static_cast<Group*>(parent);
    auto store = c10::make_intrusive<c10d::PrefixStore>(std::string(tag), p->store);
    c10::intrusive_ptr<c10d::Backend> pg;
    if (p->kind == 0) {
      auto o = c10d::ProcessGroupGloo::Options::create(p->timeout);
      o->devices = p->devices;
      pg = c10::make_intrusive<c10d::ProcessGroupGloo>(store, index, n, o);
    } else {
#ifdef LEGO_RL_NCCL
      auto o = c10d::ProcessGroupNCCL::Options::create();
      o->timeout = p->timeout;
      pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, index, n, o);
#else
      throw std::runtime_error(
          "this lego-rl was built without NCCL (no CUDA torch wheel or CUDA headers at build time; scripts/setup.sh fetches them)");
#endif
    }
    group = new Group();
    group->store = store;
    group->backend = pg;
    group->kind = p->kind;
    group->devices = p->devices;
    group->timeout = p->timeout;
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
    auto* grp = static_cast<Group*>(g);
    on_group(grp, [&] { wait(grp->backend->allreduce(ts, o), timeout_ms); });
  });
}

int lr_dist_broadcast(void* g, void* t, int root, int64_t timeout_ms, char** err) {
  return guarded(err, [&] {
    std::vector<at::Tensor> ts{tensor(t)};
    c10d::BroadcastOptions o;
    o.rootRank = root;
    o.timeout = std::chrono::milliseconds(timeout_ms);
    auto* grp = static_cast<Group*>(g);
    on_group(grp, [&] { wait(grp->backend->broadcast(ts, o), timeout_ms); });
  });
}

// `out` holds world_size × numel(input), rank r's input at block r.
int lr_dist_all_gather(void* g, void* out, void* in, int64_t timeout_ms, char** err) {
  return guarded(err, [&] {
    c10d::AllgatherOptions o;
    o.timeout = std::chrono::milliseconds(timeout_ms);
    auto* grp = static_cast<Group*>(g);
    on_group(grp, [&] {
      wait(grp->backend->_allgather_base(tensor(out), tensor(in), o), timeout_ms);
    });
  });
}

// `in` holds world_size × numel(out); rank r receives the reduction of every rank's block r.
int lr_dist_reduce_scatter(
    void* g, void* out, void* in, int op, int64_t timeout_ms, char** err) {
  return guarded(err, [&] {
    c10d::ReduceScatterOptions o;
    o.reduceOp = reduce_op(op);
    o.timeout = std::chrono::milliseconds(timeout_ms);
    auto* grp = static_cast<Group*>(g);
    on_group(grp, [&] {
      wait(grp->backend->_reduce_scatter_base(tensor(out), tensor(in), o), timeout_ms);
    });
  });
}

// Equal splits along dim 0: block j of `in` goes to rank j, block i of `out` comes from rank i.
int lr_dist_all_to_all(void* g, void* out, void* in, int64_t timeout_ms, char** err) {
  return guarded(err, [&] {
    c10d::AllToAllOptions o;
    o.timeout = std::chrono::milliseconds(timeout_ms);
    std::vector<int64_t> splits;
    auto* grp = static_cast<Group*>(g);
    on_group(grp, [&] {
      wait(grp->backend->alltoall_base(tensor(out), tensor(in), splits, splits, o), timeout_ms);
    });
  });
}

int lr_dist_barrier(void* g, int64_t timeout_ms, char** err) {
  return guarded(err, [&] {
    c10d::BarrierOptions o;
    o.timeout = std::chrono::milliseconds(timeout_ms);
    auto* grp = static_cast<Group*>(g);
    on_group(grp, [&] { wait(grp->backend->barrier(o), timeout_ms); });
  });
}

// Uneven splits along dim 0: `in_splits[j]` rows of `in` go to rank j, `out_splits[i]` rows of
// `out` come from rank i (`n` = the group's size entries each).
int lr_dist_all_to_all_v(
    void* g,
    void* out,
    void* in,
    const int64_t* out_splits,
    const int64_t* in_splits,
    int64_t n,
    int64_t timeout_ms,
    char** err) {
  return guarded(err, [&] {
    auto* grp = static_cast<Group*>(g);
    auto os = splits(out_splits, n);
    auto is = splits(in_splits, n);
    on_group(grp, [&] {
      c10d::AllToAllOptions o;
      o.timeout = std::chrono::milliseconds(timeout_ms);
      wait(grp->backend->alltoall_base(tensor(out), tensor(in), os, is, o), timeout_ms);
    });
  });
}

// The differentiable all_to_all: a new tensor (to be owned by tch, which frees it with
// `delete`) holding the received rows, with a grad_fn when `in` requires grad.
void* lr_dist_all_to_all_autograd(
    void* g,
    void* in,
    const int64_t* out_splits,
    const int64_t* in_splits,
    int64_t n,
    int64_t timeout_ms,
    char** err) {
  at::Tensor* result = nullptr;
  guarded(err, [&] {
    auto out = AllToAll::apply(
        tensor(in),
        reinterpret_cast<int64_t>(g),
        splits(out_splits, n),
        splits(in_splits, n),
        timeout_ms);
    result = new at::Tensor(std::move(out));
  });
  return result;
}

// The first failure of a collective of this group, or NULL (malloc'ed, freed by the caller).
char* lr_dist_poisoned(void* g) {
  auto* grp = static_cast<Group*>(g);
  std::lock_guard<std::mutex> lock(grp->mu);
  return grp->poisoned.empty() ? nullptr : dup(grp->poisoned);
}

} // extern "C"
