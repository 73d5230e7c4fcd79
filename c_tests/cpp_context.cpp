// A C++ program: an RAII owner of a context, the enums as C++ types, errors as exceptions.
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>

#include "mcast.h"

namespace {

void check(mcast_status_t status, const char *what) {
  if (status != MCAST_SUCCESS) {
    throw std::runtime_error(std::string(what) + ": " + mcast_status_string(status) + ": " +
                             mcast_last_error());
  }
}

class Context {
 public:
  explicit Context(const mcast_config_t *config) {
    check(mcast_context_create(config, &ctx_), "mcast_context_create");
  }
  Context(const Context &) = delete;
  Context &operator=(const Context &) = delete;
  Context(Context &&other) noexcept : ctx_(std::exchange(other.ctx_, mcast_context_t{0})) {}
  ~Context() {
    mcast_context_destroy(ctx_);
  }  // the zero handle (moved from) is a no-op

  int device_count() const {
    int count = 0;
    check(mcast_device_count(ctx_, &count), "mcast_device_count");
    return count;
  }
  mcast_context_t handle() const {
    return ctx_;
  }

 private:
  mcast_context_t ctx_{0};
};

}  // namespace

int main() {
  try {
    mcast_config_t config;
    mcast_config_init(&config);
    config.backend = MCAST_BACKEND_SIM;
    config.sim_devices = 3;

    mcast_context_t stale{0};
    {
      Context ctx(&config);
      Context moved(std::move(ctx));
      if (moved.device_count() != 3) {
        std::fprintf(stderr, "expected 3 devices, got %d\n", moved.device_count());
        return 1;
      }
      stale = moved.handle();
    }
    int count = 0;
    if (mcast_device_count(stale, &count) != MCAST_ERROR_INVALID_HANDLE) {
      std::fprintf(stderr, "a destroyed context is still usable\n");
      return 1;
    }

    config.backend = static_cast<mcast_backend_t>(77);  // a C++ caller can do this too
    try {
      Context bad(&config);
      std::fprintf(stderr, "backend 77 was accepted\n");
      return 1;
    } catch (const std::runtime_error &e) {
      if (std::strstr(e.what(), "MCAST_ERROR_INVALID_ARGUMENT") == nullptr) {
        std::fprintf(stderr, "unexpected error: %s\n", e.what());
        return 1;
      }
    }
  } catch (const std::exception &e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
