// Declarations of the few Gloo types that libtorch's ProcessGroupGloo.hpp names.
//
// Why this file exists: the PyPI torch wheel ships the c10d headers and exports
// c10d::ProcessGroupGloo from libtorch_cpu.so, but it does not ship Gloo's own headers, which
// ProcessGroupGloo.hpp includes. build.rs makes <gloo/context.h> and the other four names it
// includes point here.
//
// This is sound because the shim only uses Gloo types through pointers: ProcessGroupGloo holds
// shared_ptr/unique_ptr to them (whose size does not depend on the pointee), and the shim never
// constructs a GlooStore or calls into a Gloo object; all Gloo code that runs is libtorch's own,
// compiled against the real headers. The member functions declared below exist only so the
// inline bodies in ProcessGroupGloo.hpp parse; the shim calls none of them.
#pragma once

#include <chrono>
#include <string>
#include <vector>

namespace gloo {

class Context {
 public:
  void setTimeout(std::chrono::milliseconds timeout);
};

namespace transport {
class Device;
class UnboundBuffer;
} // namespace transport

namespace rendezvous {
class Store {
 public:
  virtual ~Store() = default;
  virtual void set(const std::string& key, const std::vector<char>& data) = 0;
  virtual std::vector<char> get(const std::string& key) = 0;
  virtual void wait(const std::vector<std::string>& keys) = 0;
  virtual void wait(
      const std::vector<std::string>& keys,
      const std::chrono::milliseconds& timeout) = 0;
};
} // namespace rendezvous

} // namespace gloo
