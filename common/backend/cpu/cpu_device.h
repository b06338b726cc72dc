// The CPU device: host memory and a CpuStream (ops run at once; a recorded
// graph replays closures). Not thread-safe: one engine thread uses it.
#ifndef TANDEM_COMMON_BACKEND_CPU_CPU_DEVICE_H_
#define TANDEM_COMMON_BACKEND_CPU_CPU_DEVICE_H_

#include <memory>

#include "common/backend/device.h"

namespace tandem {

std::unique_ptr<Device> CreateCpuDevice();

}  // namespace tandem

#endif  // TANDEM_COMMON_BACKEND_CPU_CPU_DEVICE_H_
