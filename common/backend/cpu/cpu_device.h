// The CPU device: host memory and a CpuStream (ops run at once; a recorded
// graph replays closures). Not thread-safe: one engine thread uses it.
#ifndef TANDEM_COMMON_BACKEND_CPU_CPU_DEVICE_H_
#define TANDEM_COMMON_BACKEND_CPU_CPU_DEVICE_H_

#include <memory>

#include "common/backend/device.h"

namespace tandem {

// With `late_gathers` (--debug-async-kv-reads) a gather completes as a GPU's
// does, after the host has gone on: ready() is false for the first few polls.
// The path a GPU's KV hand-off takes
// then runs, and is tested, on the CPU.
std::unique_ptr<Device> CreateCpuDevice(bool late_gathers = false);

}  // namespace tandem

#endif  // TANDEM_COMMON_BACKEND_CPU_CPU_DEVICE_H_
