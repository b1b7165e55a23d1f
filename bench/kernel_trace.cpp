// A kernel timeline of any CUDA program, through CUPTI's injection hook: the CUDA driver loads this
// library when CUDA_INJECTION64_PATH names it and calls InitializeInjection() before the program's
// first CUDA call. Every kernel (graph-launched ones one by one) is recorded with its start and end
// on the GPU's clock, its device and stream, and written at exit to AB_TRACE_DIR (default .) as
// kernels-<pid>.csv (start_ns,end_ns,device,stream,name_id) and names-<pid>.csv (name_id,name).
// Two more kinds of row, named in brackets: every memcpy ("[memcpy <kind> <bytes> B]", or "... B
// from <device>]" between two devices; on the GPU's clock, its device and stream) and every
// cudaGraphLaunch call ("[api cudaGraphLaunch]": on the host, device 4294967295, stream = the
// calling thread; CUPTI puts both on one time base), so a step's copies and how long its host
// launch blocked line up with its kernels.
// Used by bench/trace_steps.py to see where a data-parallel step loses time (issue 8): how long
// NCCL's kernels run beside the compute, and how much the compute slows down while they do.
// Not part of accelbench: a measurement tool that watches it from outside.
#include <cupti.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include <unistd.h>

namespace {

struct KernelRecord {
  std::uint64_t start_ns, end_ns;
  std::uint32_t device, stream, name_id;
};

constexpr std::size_t kBufferBytes = std::size_t{8} << 20;
constexpr std::size_t kAlignment = 8;
// ~32 bytes a record: a cap so that a long run cannot fill the host (about 1 GB at most).
constexpr std::size_t kMaxRecords = std::size_t{32} << 20;

std::mutex g_mutex;
std::vector<KernelRecord>* g_records = nullptr;
std::unordered_map<const char*, std::uint32_t>* g_name_ids = nullptr;  // CUPTI shares one pointer per kernel
std::unordered_map<std::string, std::uint32_t>* g_made_name_ids = nullptr;  // the bracketed rows' names
std::vector<std::string>* g_names = nullptr;
std::size_t g_dropped = 0;        // over kMaxRecords
std::size_t g_cupti_dropped = 0;  // lost inside CUPTI

void report(const char* what, CUptiResult r) {
  const char* text = nullptr;
  cuptiGetResultString(r, &text);
  std::fprintf(stderr, "kernel_trace: %s failed: %s\n", what, text != nullptr ? text : "unknown error");
}

constexpr std::uint32_t kHostDevice = 0xffffffffu;  // the device column of host-side rows

const char* memcpy_kind(std::uint8_t kind) {
  switch (kind) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD: return "HtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH: return "DtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD: return "DtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_PTOP: return "PtoP";
    default: return "other";
  }
}

// Under g_mutex.
std::uint32_t made_name_id(const std::string& name) {
  auto [it, added] = g_made_name_ids->try_emplace(name, static_cast<std::uint32_t>(g_names->size()));
  if (added) g_names->push_back(name);
  return it->second;
}

void CUPTIAPI buffer_requested(std::uint8_t** buffer, std::size_t* size, std::size_t* max_records) {
  *buffer = static_cast<std::uint8_t*>(std::aligned_alloc(kAlignment, kBufferBytes));
  *size = *buffer != nullptr ? kBufferBytes : 0;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext context, std::uint32_t stream_id, std::uint8_t* buffer, std::size_t,
                               std::size_t valid_bytes) {
  CUpti_Activity* record = nullptr;
  {
    const std::lock_guard<std::mutex> lock(g_mutex);
    std::size_t lost = 0;  // records CUPTI itself could not keep (its buffers full)
    if (cuptiActivityGetNumDroppedRecords(context, stream_id, &lost) == CUPTI_SUCCESS) g_cupti_dropped += lost;
    while (cuptiActivityGetNextRecord(buffer, valid_bytes, &record) == CUPTI_SUCCESS) {
      if (g_records->size() >= kMaxRecords) {
        ++g_dropped;
        continue;
      }
      if (record->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
        const std::string name = "[memcpy " + std::string(memcpy_kind(m->copyKind)) + " " + std::to_string(m->bytes) + " B]";
        g_records->push_back({m->start, m->end, m->deviceId, m->streamId, made_name_id(name)});
      } else if (record->kind == CUPTI_ACTIVITY_KIND_MEMCPY2) {  // between two devices (CUDA IPC included)
        const auto* m = reinterpret_cast<const CUpti_ActivityMemcpyPtoP4*>(record);
        const std::string name = "[memcpy " + std::string(memcpy_kind(m->copyKind)) + " " + std::to_string(m->bytes) +
                                 " B from " + std::to_string(m->srcDeviceId) + "]";
        g_records->push_back({m->start, m->end, m->deviceId, m->streamId, made_name_id(name)});
      } else if (record->kind == CUPTI_ACTIVITY_KIND_RUNTIME) {
        const auto* a = reinterpret_cast<const CUpti_ActivityAPI*>(record);
        if (a->cbid != CUPTI_RUNTIME_TRACE_CBID_cudaGraphLaunch_v10000 &&
            a->cbid != CUPTI_RUNTIME_TRACE_CBID_cudaGraphLaunch_ptsz_v10000)
          continue;
        g_records->push_back({a->start, a->end, kHostDevice, a->threadId, made_name_id("[api cudaGraphLaunch]")});
      } else if (record->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || record->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
        const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
        auto [it, added] = g_name_ids->try_emplace(k->name, static_cast<std::uint32_t>(g_names->size()));
        if (added) g_names->emplace_back(k->name != nullptr ? k->name : "?");
        g_records->push_back({k->start, k->end, k->deviceId, k->streamId, it->second});
      }
    }
  }
  std::free(buffer);
}

void write_trace() {
  const CUptiResult flushed = cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  if (flushed != CUPTI_SUCCESS) report("cuptiActivityFlushAll", flushed);
  const std::lock_guard<std::mutex> lock(g_mutex);
  const char* dir = std::getenv("AB_TRACE_DIR");
  const std::string prefix = std::string(dir != nullptr ? dir : ".") + "/";
  const std::string pid = std::to_string(getpid());
  if (std::FILE* f = std::fopen((prefix + "kernels-" + pid + ".csv").c_str(), "w")) {
    std::fprintf(f, "start_ns,end_ns,device,stream,name_id\n");
    for (const KernelRecord& r : *g_records)
      std::fprintf(f, "%llu,%llu,%u,%u,%u\n", static_cast<unsigned long long>(r.start_ns),
                   static_cast<unsigned long long>(r.end_ns), r.device, r.stream, r.name_id);
    std::fclose(f);
  }
  if (std::FILE* f = std::fopen((prefix + "names-" + pid + ".csv").c_str(), "w")) {
    for (std::size_t i = 0; i < g_names->size(); ++i) std::fprintf(f, "%zu,%s\n", i, (*g_names)[i].c_str());
    std::fclose(f);
  }
  std::fprintf(stderr, "kernel_trace: pid %s wrote %zu kernels (%zu dropped over the cap, %zu lost by CUPTI)\n",
               pid.c_str(), g_records->size(), g_dropped, g_cupti_dropped);
}

}  // namespace

extern "C" int InitializeInjection() {
  g_records = new std::vector<KernelRecord>();  // never freed: read at exit, after statics may be gone
  g_records->reserve(std::size_t{1} << 20);
  g_name_ids = new std::unordered_map<const char*, std::uint32_t>();
  g_names = new std::vector<std::string>();
  g_made_name_ids = new std::unordered_map<std::string, std::uint32_t>();
  CUptiResult r = cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed);
  if (r != CUPTI_SUCCESS) {
    report("cuptiActivityRegisterCallbacks", r);
    return 0;
  }
  // CONCURRENT_KERNEL keeps kernels concurrent (KERNEL would serialize them).
  r = cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
  if (r != CUPTI_SUCCESS) {
    report("cuptiActivityEnable(CONCURRENT_KERNEL)", r);
    return 0;
  }
  for (const CUpti_ActivityKind kind : {CUPTI_ACTIVITY_KIND_MEMCPY, CUPTI_ACTIVITY_KIND_MEMCPY2, CUPTI_ACTIVITY_KIND_RUNTIME})
    if (const CUptiResult e = cuptiActivityEnable(kind); e != CUPTI_SUCCESS) report("cuptiActivityEnable(memcpy/runtime)", e);
  std::atexit(write_trace);
  return 1;
}
