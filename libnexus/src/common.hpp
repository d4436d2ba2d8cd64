// Private helpers shared by every libnexus source file: the error model of the C ABI and small utilities.
#pragma once

#include <cstdint>
#include <cstring>
#include <new>
#include <stdexcept>
#include <string>

#include "nexus.h"

namespace nexus {

// A failure with a status code for the C boundary. Thrown inside the library, caught by guard().
class Error : public std::runtime_error {
public:
    Error(int32_t status, const std::string &message) : std::runtime_error(message), status_(status) {}
    int32_t status() const noexcept { return status_; }

private:
    int32_t status_;
};

[[noreturn]] inline void fail(int32_t status, const std::string &message) { throw Error(status, message); }
[[noreturn]] inline void invalid(const std::string &message) { throw Error(NEXUS_ERR_INVALID, message); }

void set_last_error(const char *message) noexcept;

// Runs f and turns every exception into a status plus a thread-local message: no exception crosses the ABI.
template <class F>
int32_t guard(F &&f) noexcept {
    try {
        f();
        return NEXUS_OK;
    } catch (const Error &e) {
        set_last_error(e.what());
        return e.status();
    } catch (const std::bad_alloc &) {
        set_last_error("out of memory");
        return NEXUS_ERR_NOMEM;
    } catch (const std::exception &e) {
        try {
            set_last_error((std::string("internal error: ") + e.what()).c_str());
        } catch (...) {
            set_last_error("internal error");
        }
        return NEXUS_ERR_INTERNAL;
    } catch (...) {
        set_last_error("internal error: unknown exception");
        return NEXUS_ERR_INTERNAL;
    }
}

inline void require_ptr(const void *p, const char *name) {
    if (p == nullptr) invalid(std::string(name) + " is NULL");
}

// Unaligned little-endian stores into byte buffers (the host is little-endian, checked in atb.cpp).
template <class T>
inline uint8_t *put(uint8_t *dst, T value) noexcept {
    std::memcpy(dst, &value, sizeof(T));
    return dst + sizeof(T);
}

}  // namespace nexus
