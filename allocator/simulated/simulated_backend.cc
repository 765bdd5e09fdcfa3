#include "allocator/simulated/simulated_backend.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_format.h"
#include "common/checked_math.h"
#include "common/status_macros.h"
#include "common/units.h"

namespace headroom {
namespace {

constexpr std::array<std::string_view, kBackendCallCount> kCallNames = {
    "GetMemoryInfo", "Malloc",       "Free",          "ReserveAddressRange", "ReleaseAddressRange",
    "CreatePhysical", "ReleasePhysical", "Map",        "SetAccess",           "Unmap",
    "CreateStream",  "DestroyStream", "CreateEvent",  "DestroyEvent",        "RecordEvent",
    "QueryEvent",    "SynchronizeEvent", "SynchronizeStream", "SynchronizeDevice", "StreamWaitEvent"};

}  // namespace

std::string_view BackendCallName(BackendCall call) { return kCallNames[static_cast<size_t>(call)]; }

absl::StatusOr<std::unique_ptr<SimulatedBackend>> SimulatedBackend::Create(SimulatedBackendOptions options) {
  if (options.capacity_bytes == 0) return absl::InvalidArgumentError("simulated device: capacity_bytes must be > 0");
  if (options.capacity_bytes > kMaxSimulatedCapacity) {
    return absl::InvalidArgumentError(absl::StrFormat("simulated device: capacity_bytes %d (%s) exceeds the limit of %s",
                                                      options.capacity_bytes, FormatBytes(options.capacity_bytes),
                                                      FormatBytes(kMaxSimulatedCapacity)));
  }
  if (options.map_granularity < 512 || !std::has_single_bit(options.map_granularity)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "simulated device: map_granularity %d must be a power of two >= 512", options.map_granularity));
  }
  if (options.base_address == 0 || options.base_address % options.map_granularity != 0) {
    return absl::InvalidArgumentError("simulated device: base_address must be non-zero and granularity-aligned");
  }
  return std::unique_ptr<SimulatedBackend>(new SimulatedBackend(std::move(options)));
}

SimulatedBackend::SimulatedBackend(SimulatedBackendOptions options)
    : options_(std::move(options)),
      properties_{.name = options_.name,
                  .ordinal = 0,
                  .total_bytes = options_.capacity_bytes,
                  .map_granularity = options_.map_granularity,
                  .supports_virtual_memory = options_.supports_virtual_memory},
      next_address_(options_.base_address) {
  streams_[kDefaultStream] = StreamState{};
}

absl::Status SimulatedBackend::Enter(BackendCall call) {
  const size_t index = static_cast<size_t>(call);
  ++calls_[index];
  clock_ns_ += options_.clock_step_ns;
  std::vector<FailureSpec>& pending = failures_[index];
  if (pending.empty()) return absl::OkStatus();
  FailureSpec& spec = pending.front();
  if (spec.skip > 0) {
    --spec.skip;
    return absl::OkStatus();
  }
  const absl::StatusCode code = spec.code;
  if (--spec.count <= 0) pending.erase(pending.begin());
  return absl::Status(code, absl::StrFormat("simulated device: injected failure of %s", BackendCallName(call)));
}

absl::Status SimulatedBackend::Charge(uint64_t bytes, std::string_view what) {
  if (bytes > options_.capacity_bytes - used_bytes_) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "simulated device: out of memory in %s of %s: %s of %s in use", what, FormatBytes(bytes),
        FormatBytes(used_bytes_), FormatBytes(options_.capacity_bytes)));
  }
  used_bytes_ += bytes;
  return absl::OkStatus();
}

absl::StatusOr<DeviceAddress> SimulatedBackend::TakeAddresses(uint64_t bytes) {
  const DeviceAddress address = next_address_;
  // One spare page between ranges so that an off-by-one in the allocator
  // never lands in a neighbouring range.
  const uint64_t span = SaturatingAdd(RoundUp(std::min(bytes, kMaxSimulatedReservation), options_.map_granularity),
                                      options_.map_granularity);
  if (bytes > kMaxSimulatedReservation || span > ~uint64_t{0} - next_address_) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "simulated device: no address space left for %s (next free address 0x%x)", FormatBytes(bytes), address));
  }
  next_address_ += span;
  return address;
}

SimulatedBackend::~SimulatedBackend() {
  for (auto& [address, range] : mappings_) {
    if (range.host != nullptr) munmap(range.host, range.bytes);
  }
  for (auto& [address, range] : reservations_) {
    if (range.host != nullptr) munmap(range.host, range.bytes);
  }
  for (auto& [handle, physical] : physical_) {
    if (physical.fd >= 0) close(physical.fd);
  }
}

absl::StatusOr<MemoryInfo> SimulatedBackend::GetMemoryInfo() {
  absl::MutexLock lock(&mu_);
  HEADROOM_RETURN_IF_ERROR(Enter(BackendCall::kGetMemoryInfo));
  return MemoryInfo{.free_bytes = options_.capacity_bytes - used_bytes_, .total_bytes = options_.capacity_bytes};
}

absl::StatusOr<DeviceAddress> SimulatedBackend::Malloc(uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  HEADROOM_RETURN_IF_ERROR(Enter(BackendCall::kMalloc));
  if (bytes == 0) return absl::InvalidArgumentError("simulated device: Malloc of 0 bytes");
  HEADROOM_RETURN_IF_ERROR(Charge(bytes, "Malloc"));
  absl::StatusOr<DeviceAddress> taken = TakeAddresses(bytes);
  if (!taken.ok()) {
    used_bytes_ -= bytes;
    return taken.status();
  }
  const DeviceAddress address = *taken;
  Range range{.bytes = bytes, .accessible = true};
  if (options_.host_backing) {
    auto host = std::make_unique_for_overwrite<std::byte[]>(bytes);
    range.host = host.get();
    malloc_host_[address] = std::move(host);
  }
  mallocs_[address] = range;
  return address;
}

absl::Status SimulatedBackend::Free(DeviceAddress address) {
  absl::MutexLock lock(&mu_);
  HEADROOM_RETURN_IF_ERROR(Enter(BackendCall::kFree));
  auto it = mallocs_.find(address);
  if (it == mallocs_.end()) {
    return absl::InvalidArgumentError(absl::StrFormat("simulated device: Free of 0x%x, not a Malloc", address));
  }
  used_bytes_ -= it->second.bytes;
  mallocs_.erase(it);
  malloc_host_.erase(address);
  return absl::OkStatus();
}

absl::StatusOr<DeviceAddress> SimulatedBackend::ReserveAddressRange(uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  HEADROOM_RETURN_IF_ERROR(Enter(BackendCall::kReserveAddressRange));
  if (!options_.supports_virtual_memory) return absl::UnimplementedError("simulated device: no virtual memory API");
  if (bytes == 0 || bytes % options_.map_granularity != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "simulated device: reservation of %d bytes is not a positive multiple of the granularity %d", bytes,
        options_.map_granularity));
  }
  HEADROOM_ASSIGN_OR_RETURN(const DeviceAddress address, TakeAddresses(bytes));
  Range range{.bytes = bytes};
  if (options_.host_backing) {
    // Note [Host-backed mappings]: inaccessible address space until pages are mapped into it.
    void* host = mmap(nullptr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (host == MAP_FAILED) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "simulated device: host backing cannot reserve %s of address space: %s", FormatBytes(bytes),
          std::strerror(errno)));
    }
    range.host = static_cast<std::byte*>(host);
  }
  reservations_[address] = range;
  return address;
}

const std::pair<const DeviceAddress, SimulatedBackend::Range>* SimulatedBackend::FindReservation(
    DeviceAddress address, uint64_t bytes) const {
  auto it = reservations_.upper_bound(address);
  if (it == reservations_.begin()) return nullptr;
  --it;
  if (address + bytes > it->first + it->second.bytes) return nullptr;
  return &*it;
}

absl::Status SimulatedBackend::ReleaseAddressRange(DeviceAddress address, uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  HEADROOM_RETURN_IF_ERROR(Enter(BackendCall::kReleaseAddressRange));
  auto it = reservations_.find(address);
  if (it == reservations_.end() || it->second.bytes != bytes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("simulated device: release of [0x%x, +%d) which is not a reservation", address, bytes));
  }
  auto mapped = mappings_.lower_bound(address);
  if (mapped != mappings_.end() && mapped->first < address + bytes) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "simulated device: release of reservation 0x%x which still has a mapping at 0x%x", address, mapped->first));
  }
  if (it->second.host != nullptr) munmap(it->second.host, bytes);
  reservations_.erase(it);
  return absl::OkStatus();
}

absl::StatusOr<PhysicalHandle> SimulatedBackend::CreatePhysical(uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  HEADROOM_RETURN_IF_ERROR(Enter(BackendCall::kCreatePhysical));
  if (!options_.supports_virtual_memory) return absl::UnimplementedError("simulated device: no virtual memory API");
  if (bytes == 0 || bytes % options_.map_granularity != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "simulated device: physical allocation of %d bytes is not a positive multiple of the granularity", bytes));
  }
  HEADROOM_RETURN_IF_ERROR(Charge(bytes, "CreatePhysical"));
  const PhysicalHandle handle{next_handle_++};
  Physical& physical = physical_[handle.value];
  physical.bytes = bytes;
  if (options_.host_backing) {
    // Note [Host-backed mappings]: the page's bytes live in a memory file, mapped wherever the handle is.
    physical.fd = memfd_create("headroom-simulated-page", MFD_CLOEXEC);
    if (physical.fd < 0 || ftruncate(physical.fd, static_cast<off_t>(bytes)) != 0) {
      const std::string why = std::strerror(errno);
      if (physical.fd >= 0) close(physical.fd);
      physical_.erase(handle.value);
      used_bytes_ -= bytes;
      return absl::ResourceExhaustedError(
          absl::StrFormat("simulated device: host backing cannot create a %s page: %s", FormatBytes(bytes), why));
    }
  }
  return handle;
}

absl::Status SimulatedBackend::ReleasePhysical(PhysicalHandle handle) {
  absl::MutexLock lock(&mu_);
  HEADROOM_RETURN_IF_ERROR(Enter(BackendCall::kReleasePhysical));
  auto it = physical_.find(handle.value);
  if (it == physical_.end()) {
    return absl::InvalidArgumentError(absl::StrFormat("simulated device: unknown physical handle %d", handle.value));
  }
  if (it->second.map_count > 0) {
    return absl::FailedPreconditionError(
        absl::StrFormat("simulated device: physical handle %d is still mapped", handle.value));
  }
  used_bytes_ -= it->second.bytes;
  if (it->second.fd >= 0) close(it->second.fd);
  physical_.erase(it);
  return absl::OkStatus();
}

absl::Status SimulatedBackend::Map(DeviceAddress address, uint64_t bytes, PhysicalHandle handle) {
  absl::MutexLock lock(&mu_);
  HEADROOM_RETURN_IF_ERROR(Enter(BackendCall::kMap));
  auto physical = physical_.find(handle.value);
  if (physical == physical_.end()) {
    return absl::InvalidArgumentError(absl::StrFormat("simulated device: Map of unknown handle %d", handle.value));
  }
  if (physical->second.bytes != bytes || address % options_.map_granularity != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "simulated device: Map of %d bytes at 0x%x: must be the whole handle (%d bytes) at an aligned address", bytes,
        address, physical->second.bytes));
  }
  if (FindReservation(address, bytes) == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrFormat("simulated device: Map at [0x%x, +%d) outside any reservation", address, bytes));
  }
  auto next = mappings_.lower_bound(address);
  if (next != mappings_.end() && next->first < address + bytes) {
    return absl::FailedPreconditionError(absl::StrFormat("simulated device: Map at 0x%x overlaps a mapping", address));
  }
  if (next != mappings_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second.bytes > address) {
      return absl::FailedPreconditionError(
          absl::StrFormat("simulated device: Map at 0x%x overlaps a mapping", address));
    }
  }
  std::byte* host = nullptr;
  if (options_.host_backing) {
    const auto* reservation = FindReservation(address, bytes);
    host = reservation->second.host + (address - reservation->first);
    if (mmap(host, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, physical->second.fd, 0) == MAP_FAILED) {
      return absl::ResourceExhaustedError(
          absl::StrFormat("simulated device: host backing cannot map 0x%x: %s", address, std::strerror(errno)));
    }
  }
  ++physical->second.map_count;
  mappings_[address] = Range{.bytes = bytes, .handle = handle, .host = host};
  return absl::OkStatus();
}

absl::Status SimulatedBackend::SetAccess(DeviceAddress address, uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  HEADROOM_RETURN_IF_ERROR(Enter(BackendCall::kSetAccess));
  uint64_t covered = 0;
  for (auto it = mappings_.find(address); it != mappings_.end() && it->first == address + covered && covered < bytes;
       ++it) {
    it->second.accessible = true;
    covered += it->second.bytes;
  }
  if (covered != bytes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("simulated device: SetAccess on [0x%x, +%d) which is not fully mapped", address, bytes));
  }
  return absl::OkStatus();
}

absl::Status SimulatedBackend::Unmap(DeviceAddress address, uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  HEADROOM_RETURN_IF_ERROR(Enter(BackendCall::kUnmap));
  // The range must be exactly a run of whole, adjacent mappings.
  uint64_t covered = 0;
  auto it = mappings_.find(address);
  auto first = it;
  while (it != mappings_.end() && it->first == address + covered && covered < bytes) {
    covered += it->second.bytes;
    ++it;
  }
  if (covered != bytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "simulated device: Unmap of [0x%x, +%d) which is not a run of whole mappings", address, bytes));
  }
  for (auto m = first; m != it; ++m) {
    --physical_[m->second.handle.value].map_count;
    if (m->second.host != nullptr) {  // back to reserved, inaccessible address space
      mmap(m->second.host, m->second.bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1,
           0);
    }
  }
  mappings_.erase(first, it);
  return absl::OkStatus();
}

absl::StatusOr<StreamHandle> SimulatedBackend::CreateStream() {
  absl::MutexLock lock(&mu_);
  HEADROOM_RETURN_IF_ERROR(Enter(BackendCall::kCreateStream));
  const StreamHandle stream{next_handle_++};
  streams_[stream] = StreamState{};
  return stream;
}

absl::Status SimulatedBackend::DestroyStream(StreamHandle stream) {
  absl::MutexLock lock(&mu_);
  HEADROOM_RETURN_IF_ERROR(Enter(BackendCall::kDestroyStream));
  if (stream == kDefaultStream || !streams_.contains(stream)) {
    return absl::InvalidArgumentError(absl::StrFormat("simulated device: cannot destroy stream %d", stream.value));
  }
  // Like cudaStreamDestroy: queued work still completes.
  CompleteStreamLocked(stream, streams_[stream].queued);
  // Keep the state: events recorded on it may still be queried.
  return absl::OkStatus();
}

absl::StatusOr<EventHandle> SimulatedBackend::CreateEvent() {
  absl::MutexLock lock(&mu_);
  HEADROOM_RETURN_IF_ERROR(Enter(BackendCall::kCreateEvent));
  const EventHandle event{next_handle_++};
  events_[event] = EventState{};
  return event;
}

absl::Status SimulatedBackend::DestroyEvent(EventHandle event) {
  absl::MutexLock lock(&mu_);
  HEADROOM_RETURN_IF_ERROR(Enter(BackendCall::kDestroyEvent));
  if (events_.erase(event) == 0) {
    return absl::InvalidArgumentError(absl::StrFormat("simulated device: unknown event %d", event.value));
  }
  return absl::OkStatus();
}

absl::Status SimulatedBackend::RecordEvent(EventHandle event, StreamHandle stream) {
  absl::MutexLock lock(&mu_);
  HEADROOM_RETURN_IF_ERROR(Enter(BackendCall::kRecordEvent));
  auto e = events_.find(event);
  auto s = streams_.find(stream);
  if (e == events_.end() || s == streams_.end()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("simulated device: RecordEvent of event %d on stream %d: unknown handle", event.value,
                        stream.value));
  }
  e->second = EventState{.recorded = true, .stream = stream, .item = ++s->second.queued};
  if (options_.auto_complete_events) CompleteStreamLocked(stream, s->second.queued);
  return absl::OkStatus();
}

bool SimulatedBackend::EventDone(const EventState& event) const {
  if (!event.recorded) return true;  // as cudaEventQuery on a fresh event
  return streams_.at(event.stream).completed >= event.item;
}

absl::StatusOr<bool> SimulatedBackend::QueryEvent(EventHandle event) {
  absl::MutexLock lock(&mu_);
  HEADROOM_RETURN_IF_ERROR(Enter(BackendCall::kQueryEvent));
  auto e = events_.find(event);
  if (e == events_.end()) {
    return absl::InvalidArgumentError(absl::StrFormat("simulated device: unknown event %d", event.value));
  }
  return EventDone(e->second);
}

absl::Status SimulatedBackend::SynchronizeEvent(EventHandle event) {
  absl::MutexLock lock(&mu_);
  HEADROOM_RETURN_IF_ERROR(Enter(BackendCall::kSynchronizeEvent));
  auto e = events_.find(event);
  if (e == events_.end()) {
    return absl::InvalidArgumentError(absl::StrFormat("simulated device: unknown event %d", event.value));
  }
  if (e->second.recorded) CompleteStreamLocked(e->second.stream, e->second.item);
  return absl::OkStatus();
}

absl::Status SimulatedBackend::SynchronizeStream(StreamHandle stream) {
  absl::MutexLock lock(&mu_);
  HEADROOM_RETURN_IF_ERROR(Enter(BackendCall::kSynchronizeStream));
  auto s = streams_.find(stream);
  if (s == streams_.end()) {
    return absl::InvalidArgumentError(absl::StrFormat("simulated device: unknown stream %d", stream.value));
  }
  CompleteStreamLocked(stream, s->second.queued);
  return absl::OkStatus();
}

absl::Status SimulatedBackend::SynchronizeDevice() {
  absl::MutexLock lock(&mu_);
  HEADROOM_RETURN_IF_ERROR(Enter(BackendCall::kSynchronizeDevice));
  for (auto& [stream, state] : streams_) CompleteStreamLocked(stream, state.queued);
  return absl::OkStatus();
}

absl::Status SimulatedBackend::StreamWaitEvent(StreamHandle stream, EventHandle event) {
  absl::MutexLock lock(&mu_);
  HEADROOM_RETURN_IF_ERROR(Enter(BackendCall::kStreamWaitEvent));
  auto e = events_.find(event);
  auto s = streams_.find(stream);
  if (e == events_.end() || s == streams_.end()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "simulated device: StreamWaitEvent(stream %d, event %d): unknown handle", stream.value, event.value));
  }
  if (!EventDone(e->second)) {
    s->second.waits.push_back({.after = s->second.queued, .on = e->second.stream, .item = e->second.item});
  }
  return absl::OkStatus();
}

uint64_t SimulatedBackend::NowNanoseconds() {
  absl::MutexLock lock(&mu_);
  return clock_ns_ += options_.clock_step_ns;
}

void SimulatedBackend::CompleteStreamLocked(StreamHandle stream, uint64_t up_to) {
  StreamState& state = streams_[stream];
  if (state.completed >= up_to) return;
  // Items after a wait complete only after what they waited for.
  std::vector<StreamState::Wait> waits;
  waits.swap(state.waits);
  std::vector<StreamState::Wait> kept;
  for (const StreamState::Wait& wait : waits) {
    if (wait.after < up_to) {
      CompleteStreamLocked(wait.on, wait.item);
    } else {
      kept.push_back(wait);
    }
  }
  StreamState& again = streams_[stream];  // the recursion may rehash
  again.waits.insert(again.waits.end(), kept.begin(), kept.end());
  again.completed = std::max(again.completed, up_to);
}

void SimulatedBackend::InjectFailure(BackendCall call, FailureSpec spec) {
  absl::MutexLock lock(&mu_);
  failures_[static_cast<size_t>(call)].push_back(spec);
}

void SimulatedBackend::ClearFailures() {
  absl::MutexLock lock(&mu_);
  for (auto& list : failures_) list.clear();
}

void SimulatedBackend::CompleteStream(StreamHandle stream) {
  absl::MutexLock lock(&mu_);
  auto s = streams_.find(stream);
  if (s != streams_.end()) CompleteStreamLocked(stream, s->second.queued);
}

void SimulatedBackend::CompleteAll() {
  absl::MutexLock lock(&mu_);
  for (auto& [stream, state] : streams_) CompleteStreamLocked(stream, state.queued);
}

void SimulatedBackend::AdvanceClock(uint64_t ns) {
  absl::MutexLock lock(&mu_);
  clock_ns_ += ns;
}

uint64_t SimulatedBackend::CallCount(BackendCall call) const {
  absl::MutexLock lock(&mu_);
  return calls_[static_cast<size_t>(call)];
}

uint64_t SimulatedBackend::HostSynchronizations() const {
  absl::MutexLock lock(&mu_);
  return calls_[static_cast<size_t>(BackendCall::kSynchronizeEvent)] +
         calls_[static_cast<size_t>(BackendCall::kSynchronizeStream)] +
         calls_[static_cast<size_t>(BackendCall::kSynchronizeDevice)];
}

uint64_t SimulatedBackend::used_bytes() const {
  absl::MutexLock lock(&mu_);
  return used_bytes_;
}
size_t SimulatedBackend::live_mallocs() const {
  absl::MutexLock lock(&mu_);
  return mallocs_.size();
}
size_t SimulatedBackend::live_physical_handles() const {
  absl::MutexLock lock(&mu_);
  return physical_.size();
}
size_t SimulatedBackend::live_reservations() const {
  absl::MutexLock lock(&mu_);
  return reservations_.size();
}
size_t SimulatedBackend::live_events() const {
  absl::MutexLock lock(&mu_);
  return events_.size();
}

absl::StatusOr<std::vector<SimulatedBackend::HostSpan>> SimulatedBackend::HostSpans(DeviceAddress address,
                                                                                  uint64_t bytes) {
  if (!options_.host_backing) return absl::FailedPreconditionError("simulated device: host backing is off");
  auto m = mallocs_.upper_bound(address);
  if (m != mallocs_.begin()) {
    --m;
    if (address + bytes <= m->first + m->second.bytes) {
      return std::vector<HostSpan>{{m->second.host + (address - m->first), bytes}};
    }
  }
  std::vector<HostSpan> spans;
  auto it = mappings_.upper_bound(address);
  if (it != mappings_.begin()) --it;
  uint64_t at = address;
  while (at < address + bytes && it != mappings_.end() && it->first <= at &&
         at < it->first + it->second.bytes) {
    if (!it->second.accessible) {
      return absl::FailedPreconditionError(absl::StrFormat("simulated device: 0x%x is mapped without access", at));
    }
    const uint64_t end = std::min(address + bytes, it->first + it->second.bytes);
    spans.push_back({it->second.host + (at - it->first), end - at});
    at = end;
    ++it;
  }
  if (at < address + bytes) {
    return absl::NotFoundError(absl::StrFormat("simulated device: 0x%x (in [0x%x, +%d)) is not device memory", at,
                                               address, bytes));
  }
  return spans;
}

absl::Status SimulatedBackend::FillHost(DeviceAddress address, uint64_t bytes, uint8_t value, uint64_t stride) {
  absl::MutexLock lock(&mu_);
  if (stride == 0) return absl::InvalidArgumentError("simulated device: stride 0");
  HEADROOM_ASSIGN_OR_RETURN(std::vector<HostSpan> spans, HostSpans(address, bytes));
  uint64_t offset = 0;  // of the span start within the range
  for (const HostSpan& span : spans) {
    for (uint64_t i = (stride - offset % stride) % stride; i < span.bytes; i += stride) span.data[i] = std::byte{value};
    offset += span.bytes;
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> SimulatedBackend::HostEquals(DeviceAddress address, uint64_t bytes, uint8_t value,
                                                  uint64_t stride) {
  absl::MutexLock lock(&mu_);
  if (stride == 0) return absl::InvalidArgumentError("simulated device: stride 0");
  HEADROOM_ASSIGN_OR_RETURN(std::vector<HostSpan> spans, HostSpans(address, bytes));
  uint64_t offset = 0;
  for (const HostSpan& span : spans) {
    for (uint64_t i = (stride - offset % stride) % stride; i < span.bytes; i += stride) {
      if (span.data[i] != std::byte{value}) return false;
    }
    offset += span.bytes;
  }
  return true;
}

absl::StatusOr<std::byte*> SimulatedBackend::HostPointer(DeviceAddress address, uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  HEADROOM_ASSIGN_OR_RETURN(std::vector<HostSpan> spans, HostSpans(address, bytes == 0 ? 1 : bytes));
  // Adjacent mappings of one reservation are adjacent in host memory too (Note [Host-backed mappings]).
  for (size_t i = 1; i < spans.size(); ++i) {
    if (spans[i].data != spans[i - 1].data + spans[i - 1].bytes) {
      return absl::InternalError(absl::StrFormat("simulated device: [0x%x, +%d) is not contiguous in host memory",
                                                 address, bytes));
    }
  }
  return spans.front().data;
}

}  // namespace headroom
