// CUPTI's range profiler (CUDA 12.6+): user ranges, user replay. Prepared once per run on first
// use: the profiler initialised, the chip's name and counter availability read, each metric of the
// set tried alone (a chip lacks some optional ones), and one config image built from those it has.
// Then per measurement: enable on the device's context, a counter-data image for the ranges, the
// pass run until the profiler says every pass was submitted, decode, evaluate every range, disable.
// Every CUPTI call is checked; a failure becomes the measurement's reason, never an exception out.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>
#include <cupti_profiler_host.h>
#include <cupti_profiler_target.h>
#include <cupti_range_profiler.h>
#include <cupti_result.h>
#include <cupti_target.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <stdexcept>
#include <string>
#include <vector>

#include "counters/cupti_session.h"
#include "counters/l2_flush.h"

namespace ab::counters {
namespace {

// A failed call: "<call>: <CUPTI's name for the result> (<its message>)".
struct CuptiFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

std::string result_words(CUptiResult r) {
  const char* name = nullptr;
  const char* message = nullptr;
  std::string out = cuptiGetResultString(r, &name) == CUPTI_SUCCESS && name != nullptr ? name : "CUPTI error";
  out += " (" + std::to_string(static_cast<int>(r)) + ")";
  if (cuptiGetErrorMessage(r, &message) == CUPTI_SUCCESS && message != nullptr && *message != '\0')
    out += ": " + std::string(message);
  if (r == CUPTI_ERROR_INSUFFICIENT_PRIVILEGES)
    out += "; reading counters needs root or the driver's NVreg_RestrictProfilingToAdminUsers=0";
  return out;
}

void check(CUptiResult r, const char* call) {
  if (r != CUPTI_SUCCESS) throw CuptiFailure(std::string(call) + ": " + result_words(r));
}

void check_cuda(cudaError_t e, const char* call) {
  if (e != cudaSuccess) throw CuptiFailure(std::string(call) + ": " + cudaGetErrorString(e));
}

// The device's current context, from the driver through the runtime (no link to libcuda).
CUcontext current_context(int ordinal) {
  check_cuda(cudaSetDevice(ordinal), "cudaSetDevice");
  check_cuda(cudaFree(nullptr), "cudaFree(nullptr) (creating the primary context)");
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found{};
  check_cuda(cudaGetDriverEntryPointByVersion("cuCtxGetCurrent", &fn, 12000, cudaEnableDefault, &found),
             "cudaGetDriverEntryPointByVersion(cuCtxGetCurrent)");
  if (found != cudaDriverEntryPointSuccess || fn == nullptr) throw CuptiFailure("the driver has no cuCtxGetCurrent");
  CUcontext ctx = nullptr;
  if (reinterpret_cast<PFN_cuCtxGetCurrent_v4000>(fn)(&ctx) != CUDA_SUCCESS || ctx == nullptr)
    throw CuptiFailure("cuCtxGetCurrent: no current context on cuda:" + std::to_string(ordinal));
  return ctx;
}

const char* support_word(CUpti_Profiler_Support_Level l) {
  switch (l) {
    case CUPTI_PROFILER_CONFIGURATION_SUPPORTED: return "supported";
    case CUPTI_PROFILER_CONFIGURATION_DISABLED: return "disabled";
    case CUPTI_PROFILER_CONFIGURATION_UNSUPPORTED: return "unsupported";
    default: return "unknown";
  }
}

void check_device_supported(int ordinal) {
  CUpti_Profiler_DeviceSupported_Params p{};
  p.structSize = CUpti_Profiler_DeviceSupported_Params_STRUCT_SIZE;
  p.cuDevice = ordinal;
  p.api = CUPTI_PROFILER_RANGE_PROFILING;
  check(cuptiProfilerDeviceSupported(&p), "cuptiProfilerDeviceSupported");
  if (p.isSupported == CUPTI_PROFILER_CONFIGURATION_SUPPORTED) return;
  throw CuptiFailure(std::string("cuptiProfilerDeviceSupported: range profiling not supported here (architecture ") +
                     support_word(p.architecture) + ", vGPU " + support_word(p.vGpu) + ", confidential compute " +
                     support_word(p.confidentialCompute) + ", SLI " + support_word(p.sli) + ", CMP " +
                     support_word(p.cmp) + ", WSL " + support_word(p.wsl) + ")");
}

// A profiler host object (metric configuration and evaluation), deinitialised with its scope.
class HostObject {
 public:
  HostObject(const std::string& chip, const std::vector<std::uint8_t>& availability) {
    CUpti_Profiler_Host_Initialize_Params p{};
    p.structSize = CUpti_Profiler_Host_Initialize_Params_STRUCT_SIZE;
    p.profilerType = CUPTI_PROFILER_TYPE_RANGE_PROFILER;
    p.pChipName = chip.c_str();
    p.pCounterAvailabilityImage = availability.data();
    check(cuptiProfilerHostInitialize(&p), "cuptiProfilerHostInitialize");
    host_ = p.pHostObject;
  }
  ~HostObject() {
    CUpti_Profiler_Host_Deinitialize_Params p{};
    p.structSize = CUpti_Profiler_Host_Deinitialize_Params_STRUCT_SIZE;
    p.pHostObject = host_;
    cuptiProfilerHostDeinitialize(&p);  // teardown never throws
  }
  HostObject(const HostObject&) = delete;
  HostObject& operator=(const HostObject&) = delete;
  CUpti_Profiler_Host_Object* get() const { return host_; }

  CUptiResult add(std::vector<const char*>& names) {
    CUpti_Profiler_Host_ConfigAddMetrics_Params p{};
    p.structSize = CUpti_Profiler_Host_ConfigAddMetrics_Params_STRUCT_SIZE;
    p.pHostObject = host_;
    p.ppMetricNames = names.data();
    p.numMetrics = names.size();
    return cuptiProfilerHostConfigAddMetrics(&p);
  }
  std::vector<std::uint8_t> config_image() {
    CUpti_Profiler_Host_GetConfigImageSize_Params size{};
    size.structSize = CUpti_Profiler_Host_GetConfigImageSize_Params_STRUCT_SIZE;
    size.pHostObject = host_;
    check(cuptiProfilerHostGetConfigImageSize(&size), "cuptiProfilerHostGetConfigImageSize");
    std::vector<std::uint8_t> image(size.configImageSize);
    CUpti_Profiler_Host_GetConfigImage_Params get{};
    get.structSize = CUpti_Profiler_Host_GetConfigImage_Params_STRUCT_SIZE;
    get.pHostObject = host_;
    get.configImageSize = image.size();
    get.pConfigImage = image.data();
    check(cuptiProfilerHostGetConfigImage(&get), "cuptiProfilerHostGetConfigImage");
    return image;
  }

 private:
  CUpti_Profiler_Host_Object* host_ = nullptr;
};

// The range profiler enabled on a context; started passes are stopped and the object disabled with
// its scope, also when the work of a pass threw.
class RangeProfiler {
 public:
  explicit RangeProfiler(CUcontext ctx) {
    CUpti_RangeProfiler_Enable_Params p{};
    p.structSize = CUpti_RangeProfiler_Enable_Params_STRUCT_SIZE;
    p.ctx = ctx;
    check(cuptiRangeProfilerEnable(&p), "cuptiRangeProfilerEnable");
    object_ = p.pRangeProfilerObject;
  }
  ~RangeProfiler() {
    if (started_) stop();
    CUpti_RangeProfiler_Disable_Params p{};
    p.structSize = CUpti_RangeProfiler_Disable_Params_STRUCT_SIZE;
    p.pRangeProfilerObject = object_;
    cuptiRangeProfilerDisable(&p);
  }
  RangeProfiler(const RangeProfiler&) = delete;
  RangeProfiler& operator=(const RangeProfiler&) = delete;
  CUpti_RangeProfiler_Object* get() const { return object_; }

  void start() {
    CUpti_RangeProfiler_Start_Params p{};
    p.structSize = CUpti_RangeProfiler_Start_Params_STRUCT_SIZE;
    p.pRangeProfilerObject = object_;
    check(cuptiRangeProfilerStart(&p), "cuptiRangeProfilerStart");
    started_ = true;
  }
  // Whether every pass has been submitted; CUptiResult for the destructor's use.
  CUptiResult stop(bool* all_submitted = nullptr) {
    CUpti_RangeProfiler_Stop_Params p{};
    p.structSize = CUpti_RangeProfiler_Stop_Params_STRUCT_SIZE;
    p.pRangeProfilerObject = object_;
    started_ = false;
    const CUptiResult r = cuptiRangeProfilerStop(&p);
    if (all_submitted != nullptr) *all_submitted = p.isAllPassSubmitted != 0;
    return r;
  }

 private:
  CUpti_RangeProfiler_Object* object_ = nullptr;
  bool started_ = false;
};

// User ranges: each is pushed and popped around its work, the device idle at both ends so that
// no other range's kernels are counted in it; with a flush, L2 is emptied before each push.
class CuptiMarks final : public RangeMarks {
 public:
  CuptiMarks(CUpti_RangeProfiler_Object* object, std::size_t max_ranges, L2Flush* flush)
      : object_(object), max_(max_ranges), flush_(flush) {}
  void begin(const std::string& name) override {
    if (open_)
      throw CuptiFailure("range '" + name + "' begun inside range '" + names_.back() + "' (ranges do not nest)");
    if (names_.size() >= max_) throw CuptiFailure("more than " + std::to_string(max_) + " ranges in one pass");
    check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize (before a range)");
    if (flush_ != nullptr) flush_->run();
    names_.push_back(name);
    CUpti_RangeProfiler_PushRange_Params p{};
    p.structSize = CUpti_RangeProfiler_PushRange_Params_STRUCT_SIZE;
    p.pRangeProfilerObject = object_;
    p.pRangeName = names_.back().c_str();
    check(cuptiRangeProfilerPushRange(&p), "cuptiRangeProfilerPushRange");
    open_ = true;
  }
  void end() override {
    if (!open_) throw CuptiFailure("a range ended that was not begun");
    check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize (the range's work)");
    CUpti_RangeProfiler_PopRange_Params p{};
    p.structSize = CUpti_RangeProfiler_PopRange_Params_STRUCT_SIZE;
    p.pRangeProfilerObject = object_;
    check(cuptiRangeProfilerPopRange(&p), "cuptiRangeProfilerPopRange");
    open_ = false;
  }
  std::vector<std::string> names() const { return {names_.begin(), names_.end()}; }
  void next_pass() {
    if (open_) throw CuptiFailure("a pass ended with range '" + names_.back() + "' open");
    names_.clear();
  }

 private:
  CUpti_RangeProfiler_Object* object_;
  std::size_t max_;
  L2Flush* flush_;
  std::deque<std::string> names_;  // a deque: the names CUPTI was handed stay where they are
  bool open_ = false;
};

class CuptiSession final : public CounterSession {
 public:
  CuptiSession(MetricSet set, int ordinal) : set_(set), ordinal_(ordinal) {}
  ~CuptiSession() override {
    host_.reset();  // before the profiler it belongs to
    if (!initialized_) return;
    CUpti_Profiler_DeInitialize_Params p{};
    p.structSize = CUpti_Profiler_DeInitialize_Params_STRUCT_SIZE;
    cuptiProfilerDeInitialize(&p);
  }
  CuptiSession(const CuptiSession&) = delete;
  CuptiSession& operator=(const CuptiSession&) = delete;
  MetricSet set() const override { return set_; }

  Measurement measure_marked(const std::function<void(RangeMarks&)>& pass, std::size_t max_ranges,
                             L2State l2) override {
    const auto t0 = std::chrono::steady_clock::now();
    Measurement m;
    m.set = set_;
    try {
      prepare();
      if (l2 == L2State::flushed && flush_ == nullptr) flush_ = std::make_unique<L2Flush>(ordinal_);
      m.missing = missing_;
      m.l2 = l2;
      run_passes(pass, std::max<std::size_t>(max_ranges, 1), l2 == L2State::flushed ? flush_.get() : nullptr, m);
      m.available = true;
    } catch (const std::exception& e) {
      m = Measurement{};
      m.set = set_;
      m.l2 = l2;
      m.reason = e.what();
      if (!prepared_ && failure_.empty()) failure_ = m.reason;  // the device cannot: not tried again
    }
    m.overhead_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return m;
  }

 private:
  void prepare();
  void run_passes(const std::function<void(RangeMarks&)>& pass, std::size_t max_ranges, L2Flush* flush, Measurement& m);
  std::vector<std::uint8_t> counter_data_image(CUpti_RangeProfiler_Object* object, std::size_t max_ranges);
  void evaluate(const std::vector<std::uint8_t>& image, const std::vector<std::string>& names, Measurement& m);

  MetricSet set_;
  int ordinal_;
  bool initialized_ = false, prepared_ = false;
  std::string failure_;
  CUcontext ctx_ = nullptr;
  std::string chip_;
  std::vector<std::uint8_t> availability_, config_;
  std::vector<std::string> metrics_, missing_;
  std::vector<const char*> metric_ptrs_;
  std::unique_ptr<HostObject> host_;
  std::unique_ptr<L2Flush> flush_;  // made at the first flushed measurement
};

void CuptiSession::prepare() {
  if (prepared_) return;
  if (!failure_.empty()) throw CuptiFailure(failure_);
  ctx_ = current_context(ordinal_);
  CUpti_Profiler_Initialize_Params init{};
  init.structSize = CUpti_Profiler_Initialize_Params_STRUCT_SIZE;
  check(cuptiProfilerInitialize(&init), "cuptiProfilerInitialize");
  initialized_ = true;
  check_device_supported(ordinal_);
  CUpti_Device_GetChipName_Params chip{};
  chip.structSize = CUpti_Device_GetChipName_Params_STRUCT_SIZE;
  chip.deviceIndex = static_cast<std::size_t>(ordinal_);
  check(cuptiDeviceGetChipName(&chip), "cuptiDeviceGetChipName");
  chip_ = chip.pChipName != nullptr ? chip.pChipName : "";
  CUpti_Profiler_GetCounterAvailability_Params avail{};
  avail.structSize = CUpti_Profiler_GetCounterAvailability_Params_STRUCT_SIZE;
  avail.ctx = ctx_;
  check(cuptiProfilerGetCounterAvailability(&avail), "cuptiProfilerGetCounterAvailability (size)");
  availability_.assign(avail.counterAvailabilityImageSize, 0);
  avail.pCounterAvailabilityImage = availability_.data();
  check(cuptiProfilerGetCounterAvailability(&avail), "cuptiProfilerGetCounterAvailability");
  // Each metric alone first: one the chip lacks would fail the whole configuration.
  for (const MetricInfo& info : metrics_of(set_)) {
    const std::string name(info.name);
    HostObject probe(chip_, availability_);
    std::vector<const char*> one = {name.c_str()};
    const CUptiResult r = probe.add(one);
    if (r == CUPTI_SUCCESS) {
      metrics_.push_back(name);
    } else if (info.optional) {
      missing_.push_back(name);
    } else {
      throw CuptiFailure("cuptiProfilerHostConfigAddMetrics(" + name + ") on " + chip_ + ": " + result_words(r));
    }
  }
  if (metrics_.empty()) throw CuptiFailure("no metric of the set '" + std::string(to_string(set_)) + "' on " + chip_);
  for (const auto& n : metrics_) metric_ptrs_.push_back(n.c_str());
  host_ = std::make_unique<HostObject>(chip_, availability_);
  check(host_->add(metric_ptrs_), "cuptiProfilerHostConfigAddMetrics");
  config_ = host_->config_image();
  prepared_ = true;
}

std::vector<std::uint8_t> CuptiSession::counter_data_image(CUpti_RangeProfiler_Object* object, std::size_t max_ranges) {
  CUpti_RangeProfiler_GetCounterDataSize_Params size{};
  size.structSize = CUpti_RangeProfiler_GetCounterDataSize_Params_STRUCT_SIZE;
  size.pRangeProfilerObject = object;
  size.pMetricNames = metric_ptrs_.data();
  size.numMetrics = metric_ptrs_.size();
  size.maxNumOfRanges = max_ranges;
  size.maxNumRangeTreeNodes = static_cast<std::uint32_t>(max_ranges);
  check(cuptiRangeProfilerGetCounterDataSize(&size), "cuptiRangeProfilerGetCounterDataSize");
  std::vector<std::uint8_t> image(size.counterDataSize, 0);
  CUpti_RangeProfiler_CounterDataImage_Initialize_Params init{};
  init.structSize = CUpti_RangeProfiler_CounterDataImage_Initialize_Params_STRUCT_SIZE;
  init.pRangeProfilerObject = object;
  init.counterDataSize = image.size();
  init.pCounterData = image.data();
  check(cuptiRangeProfilerCounterDataImageInitialize(&init), "cuptiRangeProfilerCounterDataImageInitialize");
  return image;
}

void CuptiSession::run_passes(const std::function<void(RangeMarks&)>& pass, std::size_t max_ranges, L2Flush* flush,
                              Measurement& m) {
  check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize (before the counter pass)");
  RangeProfiler profiler(ctx_);
  std::vector<std::uint8_t> image = counter_data_image(profiler.get(), max_ranges);
  CUpti_RangeProfiler_SetConfig_Params config{};
  config.structSize = CUpti_RangeProfiler_SetConfig_Params_STRUCT_SIZE;
  config.pRangeProfilerObject = profiler.get();
  config.configSize = config_.size();
  config.pConfig = config_.data();
  config.counterDataImageSize = image.size();
  config.pCounterDataImage = image.data();
  config.range = CUPTI_UserRange;
  config.replayMode = CUPTI_UserReplay;
  config.maxRangesPerPass = max_ranges;
  config.numNestingLevels = 1;
  config.minNestingLevel = 1;
  config.passIndex = 0;
  config.targetNestingLevel = 1;
  check(cuptiRangeProfilerSetConfig(&config), "cuptiRangeProfilerSetConfig");
  constexpr int kMaxPasses = 64;  // a set of ten metrics needs a few; more means the profiler is stuck
  CuptiMarks marks(profiler.get(), max_ranges, flush);
  bool all_submitted = false;
  std::vector<std::string> names;
  while (!all_submitted) {
    if (m.passes == kMaxPasses) throw CuptiFailure("the profiler asked for more than 64 replay passes");
    marks.next_pass();
    profiler.start();
    pass(marks);
    check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize (end of a counter pass)");
    check(profiler.stop(&all_submitted), "cuptiRangeProfilerStop");
    if (m.passes > 0 && marks.names() != names)
      throw CuptiFailure("the pass's ranges changed between replays (the work must be repeatable)");
    names = marks.names();
    ++m.passes;
  }
  CUpti_RangeProfiler_DecodeData_Params decode{};
  decode.structSize = CUpti_RangeProfiler_DecodeData_Params_STRUCT_SIZE;
  decode.pRangeProfilerObject = profiler.get();
  check(cuptiRangeProfilerDecodeData(&decode), "cuptiRangeProfilerDecodeData");
  m.dropped_ranges = decode.numOfRangeDropped;
  evaluate(image, names, m);
}

void CuptiSession::evaluate(const std::vector<std::uint8_t>& image, const std::vector<std::string>& names,
                            Measurement& m) {
  CUpti_RangeProfiler_GetCounterDataInfo_Params info{};
  info.structSize = CUpti_RangeProfiler_GetCounterDataInfo_Params_STRUCT_SIZE;
  info.pCounterDataImage = image.data();
  info.counterDataImageSize = image.size();
  check(cuptiRangeProfilerGetCounterDataInfo(&info), "cuptiRangeProfilerGetCounterDataInfo");
  if (info.numTotalRanges == 0) throw CuptiFailure("the profiler kept no range of the pass");
  std::vector<double> values(metric_ptrs_.size());
  for (std::size_t r = 0; r < info.numTotalRanges; ++r) {
    CUpti_Profiler_Host_EvaluateToGpuValues_Params eval{};
    eval.structSize = CUpti_Profiler_Host_EvaluateToGpuValues_Params_STRUCT_SIZE;
    eval.pHostObject = host_->get();
    eval.pCounterDataImage = image.data();
    eval.counterDataImageSize = image.size();
    eval.rangeIndex = r;
    eval.ppMetricNames = metric_ptrs_.data();
    eval.numMetrics = metric_ptrs_.size();
    eval.pMetricValues = values.data();
    check(cuptiProfilerHostEvaluateToGpuValues(&eval), "cuptiProfilerHostEvaluateToGpuValues");
    CUpti_RangeProfiler_CounterData_GetRangeInfo_Params range{};
    range.structSize = CUpti_RangeProfiler_CounterData_GetRangeInfo_Params_STRUCT_SIZE;
    range.pCounterDataImage = image.data();
    range.counterDataImageSize = image.size();
    range.rangeIndex = r;
    range.rangeDelimiter = "/";
    const bool named = cuptiRangeProfilerCounterDataGetRangeInfo(&range) == CUPTI_SUCCESS && range.rangeName != nullptr;
    RangeValues rv;
    rv.name = named ? range.rangeName : (r < names.size() ? names[r] : "range " + std::to_string(r));
    for (std::size_t i = 0; i < metrics_.size(); ++i) rv.values[metrics_[i]] = values[i];
    m.ranges.push_back(std::move(rv));
  }
}

}  // namespace

std::unique_ptr<CounterSession> make_cupti_session(MetricSet set, int ordinal) {
  return std::make_unique<CuptiSession>(set, ordinal);
}

}  // namespace ab::counters
