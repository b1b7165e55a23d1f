// The few NVML types, constants and signatures accelbench uses, declared here so the build needs
// no nvml.h (the cpu preset builds anywhere) and the binary no libnvidia-ml at link time. Each
// mirrors the nvml.h declaration named beside it; layouts are checked by static_assert.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ab::telemetry::nvml {

using Return = int;                   // nvmlReturn_t
using Device = struct DeviceOpaque*;  // nvmlDevice_t (nvmlDevice_st*)

// nvmlReturn_t values
constexpr Return kSuccess = 0;               // NVML_SUCCESS
constexpr Return kErrorInvalidArgument = 2;  // NVML_ERROR_INVALID_ARGUMENT
constexpr Return kErrorNotSupported = 3;     // NVML_ERROR_NOT_SUPPORTED
constexpr Return kErrorNoPermission = 4;     // NVML_ERROR_NO_PERMISSION
constexpr Return kErrorNotFound = 6;         // NVML_ERROR_NOT_FOUND
constexpr Return kErrorFunctionNotFound = 13;  // NVML_ERROR_FUNCTION_NOT_FOUND
constexpr Return kErrorGpuIsLost = 15;       // NVML_ERROR_GPU_IS_LOST

// nvmlClockType_t
constexpr unsigned kClockSm = 1;   // NVML_CLOCK_SM
constexpr unsigned kClockMem = 2;  // NVML_CLOCK_MEM
// nvmlTemperatureSensors_t
constexpr unsigned kTemperatureGpu = 0;  // NVML_TEMPERATURE_GPU

// Field ids for nvmlDeviceGetFieldValues (NVML_FI_*); ids never change once assigned.
constexpr unsigned kFiNvlinkDataTxKib = 138;  // NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, cumulative KiB
constexpr unsigned kFiNvlinkDataRxKib = 139;  // NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, cumulative KiB
constexpr unsigned kFiPowerInstantMw = 186;   // NVML_FI_DEV_POWER_INSTANT, mW
constexpr unsigned kFiPcieTxBytes = 197;      // NVML_FI_DEV_PCIE_COUNT_TX_BYTES, cumulative
constexpr unsigned kFiPcieRxBytes = 198;      // NVML_FI_DEV_PCIE_COUNT_RX_BYTES, cumulative
constexpr unsigned kScopeAllLinks = 0xFFFFFFFFu;  // scopeId UINT_MAX: all NVLinks together

// nvmlValueType_t
constexpr int kValueDouble = 0, kValueUInt = 1, kValueULong = 2, kValueULongLong = 3, kValueSLongLong = 4,
              kValueSInt = 5, kValueUShort = 6;

// nvmlValue_t
union Value {
  double dVal;
  unsigned int uiVal;
  unsigned long ulVal;
  unsigned long long ullVal;
  signed long long sllVal;
  signed int siVal;
  unsigned short usVal;
};

// nvmlFieldValue_t
struct FieldValue {
  unsigned int fieldId;
  unsigned int scopeId;
  long long timestamp;    // microseconds since 1970
  long long latencyUsec;  // how stale the cached value may be
  int valueType;          // nvmlValueType_t
  Return nvmlReturn;
  Value value;
};
static_assert(offsetof(FieldValue, timestamp) == 8 && offsetof(FieldValue, valueType) == 24 &&
                  offsetof(FieldValue, nvmlReturn) == 28 && offsetof(FieldValue, value) == 32 &&
                  sizeof(FieldValue) == 40,
              "nvmlFieldValue_t layout");

// nvmlUtilization_t
struct Utilization {
  unsigned int gpu, memory;  // percent
};
// nvmlMemory_t (v1)
struct Memory {
  unsigned long long total, free, used;  // bytes
};
// nvmlPciInfo_t
struct PciInfo {
  char busIdLegacy[16];
  unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
  char busId[32];
};
static_assert(offsetof(PciInfo, domain) == 16 && offsetof(PciInfo, busId) == 36 && sizeof(PciInfo) == 68,
              "nvmlPciInfo_t layout");

// Topology (the context block's `topology`).
constexpr unsigned kNvlinkMaxLinks = 18;  // NVML_NVLINK_MAX_LINKS
constexpr int kFeatureEnabled = 1;        // NVML_FEATURE_ENABLED (nvmlEnableState_t)
// nvmlIntNvLinkDeviceType_t
constexpr int kNvlinkDeviceGpu = 0, kNvlinkDeviceIbmNpu = 1, kNvlinkDeviceSwitch = 2, kNvlinkDeviceUnknown = 0xFF;
// nvmlGpuP2PCapsIndex_t
constexpr int kP2pCapsRead = 0, kP2pCapsNvlink = 2;
constexpr int kP2pStatusOk = 0;  // nvmlGpuP2PStatus_t NVML_P2P_STATUS_OK
// nvmlGpuTopologyLevel_t (NVML_TOPOLOGY_*) is a plain int: 0 internal, 10 single switch, 20
// multiple switches, 30 host bridge, 40 NUMA node, 50 system. nvmlNvlinkVersion_t: 1 = 1.0,
// 2 = 2.0, 3 = 2.2, 4 = 3.0, 5 = 3.1, 6 = 4.0, 7 = 5.0 (NVML_NVLINK_VERSION_*).

constexpr unsigned kDeviceNameBufferSize = 96;          // NVML_DEVICE_NAME_V2_BUFFER_SIZE
constexpr unsigned kSystemDriverVersionBufferSize = 80;  // NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE

}  // namespace ab::telemetry::nvml
