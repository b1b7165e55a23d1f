// Data-parallel training's gradient averaging (models.h, DataParallel): the NCCL averager of the
// backend on CUDA, the launch's host exchange elsewhere.
#include <cstring>

#include "backend/collectives.h"
#include "core/error.h"
#include "dist/world_group.h"
#include "workloads/models/models.h"

namespace ab::workloads::zoo {
namespace {

class NcclGradientAverager final : public nn::GradientAverager {
 public:
  explicit NcclGradientAverager(std::unique_ptr<backend::StreamAverager> s) : s_(std::move(s)) {}
  void average(const Tensor& flat) override { s_->average(flat.data, flat.numel(), flat.dtype); }
  void join() override { s_->join(); }

 private:
  std::unique_ptr<backend::StreamAverager> s_;
};

// Every rank's block through the host, summed in rank order in float64 (the same bits on every
// rank) and divided by the ranks. Synchronous: slow, and only for host backends (tests).
class HostGradientAverager final : public nn::GradientAverager {
 public:
  HostGradientAverager(dist::Comm& comm, nn::Kernels& kernels) : comm_(comm), k_(kernels) {}
  void average(const Tensor& flat) override {
    std::vector<unsigned char> host(static_cast<std::size_t>(flat.size_bytes()));
    k_.download(flat, host.data());
    Tensor staging = flat;
    staging.data = host.data();
    staging.device = DeviceKind::host;
    const std::vector<double> mine = read_host(staging);
    dist::Bytes bytes(mine.size() * sizeof(double));
    std::memcpy(bytes.data(), mine.data(), bytes.size());
    std::vector<double> sum(mine.size(), 0.0), theirs(mine.size());
    const std::vector<dist::Bytes> all = comm_.allgather(bytes);
    for (const dist::Bytes& b : all) {
      if (b.size() != bytes.size()) throw Error("data parallelism: ranks' gradient blocks differ in size");
      std::memcpy(theirs.data(), b.data(), b.size());
      for (std::size_t i = 0; i < sum.size(); ++i) sum[i] += theirs[i];
    }
    for (double& v : sum) v /= static_cast<double>(all.size());
    write_host(staging, sum);
    k_.upload(flat, host.data());
  }
  void join() override {}

 private:
  dist::Comm& comm_;
  nn::Kernels& k_;
};

}  // namespace

DataParallel::DataParallel(backend::Backend& backend, dist::Comm& comm, int gpus, std::int64_t bucket_bytes,
                           const backend::CommOptions& comm_options, bool high_priority)
    : comm_(comm), gpus_(gpus), bucket_bytes_(bucket_bytes), high_priority_(high_priority) {
  if (backend.info().kind == "cuda") {
    group_ = dist::first_ranks_collective_group(backend, comm, gpus, comm_options);
  } else if (gpus != comm.size()) {
    throw Unsupported("data parallelism on " + backend.info().id + " averages over the whole launch: gpus=" +
                      std::to_string(gpus) + " needs -np " + std::to_string(gpus));
  }
}

DataParallel::~DataParallel() = default;

void DataParallel::attach(nn::Graph& graph, nn::Kernels& kernels) {
  if (comm_.rank() >= gpus_) throw Error("data parallelism: rank " + std::to_string(comm_.rank()) + " does not train");
  if (group_)
    averager_ = std::make_unique<NcclGradientAverager>(group_->make_averager(high_priority_));
  else
    averager_ = std::make_unique<HostGradientAverager>(comm_, kernels);
  sync_ = std::make_unique<nn::BucketedGradientSync>(graph.parameters(), *averager_, bucket_bytes_, tail_bucket_bytes_);
  graph.set_gradient_sync(sync_.get());
}

std::size_t DataParallel::bucket_count() const { return sync_ ? sync_->buckets().size() : 0; }
std::string DataParallel::describe() const { return group_ ? "nccl" : "host"; }

std::unique_ptr<DataParallel> make_data_parallel(backend::Backend& backend, dist::Comm& comm, int gpus,
                                                 std::int64_t bucket_bytes, const backend::CommOptions& comm_options,
                                                 bool high_priority) {
  return std::make_unique<DataParallel>(backend, comm, gpus, bucket_bytes, comm_options, high_priority);
}

}  // namespace ab::workloads::zoo
