#include "dist/comm.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace ab::dist {

// resize + memcpy rather than insert: GCC 12 at -O3 warns (stringop-overflow) on byte inserts.
static void append(Bytes& out, const void* p, std::size_t n) {
  const std::size_t at = out.size();
  out.resize(at + n);
  if (n > 0) std::memcpy(out.data() + at, p, n);
}

Packer& Packer::put(double v) {
  append(out_, &v, sizeof v);
  return *this;
}

Packer& Packer::put(std::int64_t v) {
  append(out_, &v, sizeof v);
  return *this;
}

Packer& Packer::put(const std::string& s) {
  put(static_cast<std::int64_t>(s.size()));
  append(out_, s.data(), s.size());
  return *this;
}

void Unpacker::take(void* out, std::size_t n) {
  if (pos_ + n > in_.size()) throw Error("dist: a message from another rank is shorter than expected");
  std::memcpy(out, in_.data() + pos_, n);
  pos_ += n;
}

double Unpacker::get_double() {
  double v = 0;
  take(&v, sizeof v);
  return v;
}

std::int64_t Unpacker::get_int() {
  std::int64_t v = 0;
  take(&v, sizeof v);
  return v;
}

std::string Unpacker::get_string() {
  const std::int64_t n = get_int();
  if (n < 0 || pos_ + static_cast<std::size_t>(n) > in_.size())
    throw Error("dist: a message from another rank is shorter than expected");
  std::string s(reinterpret_cast<const char*>(in_.data() + pos_), static_cast<std::size_t>(n));
  pos_ += static_cast<std::size_t>(n);
  return s;
}

Outcome agree(Comm& comm, const Outcome& local) {
  if (comm.size() == 1) return local;
  const auto all = comm.allgather(Packer().put(static_cast<std::int64_t>(local.code)).put(local.message).bytes());
  std::vector<Outcome> outcomes;
  for (const auto& bytes : all) {
    Unpacker in(bytes);
    const auto code = static_cast<int>(in.get_int());
    outcomes.push_back({code, in.get_string()});
  }
  const bool same = std::all_of(outcomes.begin(), outcomes.end(), [&](const Outcome& o) {
    return o.code == outcomes.front().code && o.message == outcomes.front().message;
  });
  if (same) return outcomes.front();  // every rank alike (a skip for the same reason): no rank to name
  for (std::size_t r = 0; r < outcomes.size(); ++r)
    if (outcomes[r].code != 0) return {outcomes[r].code, "rank " + std::to_string(r) + ": " + outcomes[r].message};
  return {};
}

std::int64_t sum_over_ranks(Comm& comm, std::int64_t value) {
  if (comm.size() == 1) return value;
  std::int64_t sum = 0;
  for (const auto& b : comm.allgather(Packer().put(value).bytes())) sum += Unpacker(b).get_int();
  return sum;
}

double max_over_ranks(Comm& comm, double value) {
  if (comm.size() == 1) return value;
  double best = value;
  for (const auto& b : comm.allgather(Packer().put(value).bytes())) best = std::max(best, Unpacker(b).get_double());
  return best;
}

bool same_on_all_ranks(Comm& comm, const std::string& text) {
  if (comm.size() == 1) return true;
  std::int64_t hash = 0;  // FNV-1a: a plan's text can be long, its hash is 8 bytes
  std::uint64_t h = 14695981039346656037ull;
  for (const unsigned char c : text) h = (h ^ c) * 1099511628211ull;
  std::memcpy(&hash, &h, sizeof hash);
  const auto all = comm.allgather(Packer().put(hash).put(static_cast<std::int64_t>(text.size())).bytes());
  for (const auto& b : all)
    if (b != all.front()) return false;
  return true;
}

std::vector<RankPlace> gather_places(Comm& comm, const std::string& device, const std::string& pci_bus_id) {
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) != 0) host[0] = '\0';
  Packer mine;
  mine.put(static_cast<std::int64_t>(launch_info().local_rank)).put(std::string(host)).put(device).put(pci_bus_id);
  std::vector<RankPlace> out;
  const auto all = comm.allgather(mine.bytes());
  for (std::size_t r = 0; r < all.size(); ++r) {
    Unpacker in(all[r]);
    RankPlace p;
    p.rank = static_cast<int>(r);
    p.local_rank = static_cast<int>(in.get_int());
    p.host = in.get_string();
    p.device = in.get_string();
    p.pci_bus_id = in.get_string();
    out.push_back(p);
  }
  return out;
}

}  // namespace ab::dist
