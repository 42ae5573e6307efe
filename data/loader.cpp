// data/loader.cpp: transforms (pad-crop, random-resized crop, flip, normalise) and the worker pool.
#include "data/loader.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <type_traits>

#include "core/check.h"
#include "core/parallel.h"
#include "core/philox.h"

namespace ringtrain::data {
namespace {

// Random words for one sample: block = sample index, stream = (epoch, draw group).
Philox4 draws(uint64_t seed, int64_t epoch, int64_t sample, uint64_t group) {
  return philox4x32_10(seed ^ 0x6a09e667f3bcc909ull, static_cast<uint64_t>(sample),
                       (static_cast<uint64_t>(epoch) << 8) | group);
}
double unit(uint32_t w) { return (w >> 8) * (1.0 / 16777216.0); }  // [0, 1)

struct Crop {
  double y0, x0, h, w;  // source window (may be fractional for the resized crop)
};

Crop resized_crop_window(int64_t height, int64_t width, bool train, uint64_t seed, int64_t epoch, int64_t sample) {
  const double area = static_cast<double>(height * width);
  if (train) {
    // torchvision's RandomResizedCrop: up to 10 attempts, then the central crop at a clamped ratio.
    for (uint64_t attempt = 0; attempt < 10; ++attempt) {
      const Philox4 r = draws(seed, epoch, sample, 8 + attempt);
      const double scale = 0.08 + (1.0 - 0.08) * unit(r.v[0]);
      const double log_ratio = std::log(3.0 / 4.0) + (std::log(4.0 / 3.0) - std::log(3.0 / 4.0)) * unit(r.v[1]);
      const double ratio = std::exp(log_ratio);
      const double w = std::round(std::sqrt(area * scale * ratio)), h = std::round(std::sqrt(area * scale / ratio));
      if (w >= 1 && h >= 1 && w <= width && h <= height) {
        const double y0 = std::floor(unit(r.v[2]) * (height - h + 1)), x0 = std::floor(unit(r.v[3]) * (width - w + 1));
        return {y0, x0, h, w};
      }
    }
  }
  const double side = static_cast<double>(std::min(height, width));
  return {std::floor((height - side) / 2), std::floor((width - side) / 2), side, side};
}

}  // namespace

std::array<int64_t, 3> transformed_shape(const SplitInfo& info, const Transform& t) {
  if (t.resized_crop > 0) return {t.resized_crop, t.resized_crop, info.channels};
  return {info.height, info.width, info.channels};
}

namespace {

// The transform's inner loops, for one output element type. scale/shift: per-channel normalisation.
template <typename Out>
void transform_into(const SplitInfo& info, const Transform& t, const uint8_t* image, uint64_t seed, int64_t epoch,
                    int64_t sample_index, Out* out, const float* scale, const float* shift) {
  const int64_t H = info.height, W = info.width, C = info.channels;
  const auto [OH, OW, OC] = transformed_shape(info, t);
  (void)OC;
  auto store = [](float v) {
    if constexpr (std::is_same_v<Out, BFloat16>) return f32_to_bf16(v);
    else return v;
  };
  const Philox4 r = draws(seed, epoch, sample_index, 0);
  const bool flip = t.hflip && t.train && (r.v[0] & 1u);
  if (t.resized_crop > 0) {
    const Crop crop = resized_crop_window(H, W, t.train, seed, epoch, sample_index);
    // Bilinear sampling at pixel centres of the crop window; column taps computed once per image.
    const double sy = crop.h / static_cast<double>(OH), sx = crop.w / static_cast<double>(OW);
    std::vector<int64_t> col0(static_cast<size_t>(OW)), col1(static_cast<size_t>(OW));
    std::vector<float> colw(static_cast<size_t>(OW));
    for (int64_t ox = 0; ox < OW; ++ox) {
      const int64_t tx = flip ? OW - 1 - ox : ox;
      const double fx = std::clamp(crop.x0 + (tx + 0.5) * sx - 0.5, 0.0, static_cast<double>(W - 1));
      col0[static_cast<size_t>(ox)] = static_cast<int64_t>(fx) * C;
      col1[static_cast<size_t>(ox)] = std::min(static_cast<int64_t>(fx) + 1, W - 1) * C;
      colw[static_cast<size_t>(ox)] = static_cast<float>(fx - std::floor(fx));
    }
    // Separable: each source row the crop needs is resized horizontally once (into one of two row
    // buffers), then every output row is one contiguous, vectorisable blend of two of them. The same
    // arithmetic per element as blending all four taps per pixel.
    const int64_t n = OW * C;
    std::vector<float> rows(static_cast<size_t>(2 * n)), row_scale(static_cast<size_t>(n)), row_shift(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      row_scale[static_cast<size_t>(i)] = scale[i % C];
      row_shift[static_cast<size_t>(i)] = shift[i % C];
    }
    float* held[2] = {rows.data(), rows.data() + n};
    int64_t held_y[2] = {-1, -1};
    auto horizontal = [&](int64_t y) -> const float* {
      for (int k = 0; k < 2; ++k)
        if (held_y[k] == y) return held[k];
      // Replace the older row: rows only move down, so fetching y1 never evicts the y0 just fetched.
      const int k = held_y[0] < held_y[1] ? 0 : 1;
      held_y[k] = y;
      const uint8_t* row = image + y * W * C;
      float* dst = held[k];
      for (int64_t ox = 0; ox < OW; ++ox) {
        const int64_t a0 = col0[static_cast<size_t>(ox)], a1 = col1[static_cast<size_t>(ox)];
        const float wx = colw[static_cast<size_t>(ox)];
        for (int64_t c = 0; c < C; ++c) dst[ox * C + c] = row[a0 + c] + (row[a1 + c] - row[a0 + c]) * wx;
      }
      return dst;
    };
    for (int64_t oy = 0; oy < OH; ++oy) {
      const double fy = std::clamp(crop.y0 + (oy + 0.5) * sy - 0.5, 0.0, static_cast<double>(H - 1));
      const int64_t y0 = static_cast<int64_t>(fy), y1 = std::min(y0 + 1, H - 1);
      const float wy = static_cast<float>(fy - static_cast<double>(y0));
      const float* top = horizontal(y0);
      const float* bottom = horizontal(y1);
      Out* o = out + oy * n;
      for (int64_t i = 0; i < n; ++i)
        o[i] = store((top[i] + (bottom[i] - top[i]) * wy) * row_scale[static_cast<size_t>(i)] + row_shift[static_cast<size_t>(i)]);
    }
    return;
  }
  // Pad-and-crop (offsets in [0, 2p]) or identity; zero pixels outside the image. Row by row: the
  // in-image part of a row is one tight loop.
  const int64_t p = t.train ? t.pad_crop : 0;
  const int64_t dy = p ? static_cast<int64_t>(r.v[1] % static_cast<uint32_t>(2 * p + 1)) - p : 0;
  const int64_t dx = p ? static_cast<int64_t>(r.v[2] % static_cast<uint32_t>(2 * p + 1)) - p : 0;
  std::vector<float> row_scale(static_cast<size_t>(OW * C)), row_shift(static_cast<size_t>(OW * C));
  for (int64_t i = 0; i < OW * C; ++i) {
    row_scale[static_cast<size_t>(i)] = scale[i % C];
    row_shift[static_cast<size_t>(i)] = shift[i % C];
  }
  for (int64_t y = 0; y < OH; ++y) {
    Out* o = out + y * OW * C;
    const int64_t src_y = y + dy;
    if (src_y < 0 || src_y >= H) {
      for (int64_t i = 0; i < OW * C; ++i) o[i] = store(row_shift[static_cast<size_t>(i)]);
      continue;
    }
    const uint8_t* row = image + src_y * W * C;
    if (!flip && dx == 0) {
      for (int64_t i = 0; i < OW * C; ++i)
        o[i] = store(row[i] * row_scale[static_cast<size_t>(i)] + row_shift[static_cast<size_t>(i)]);
      continue;
    }
    for (int64_t x = 0; x < OW; ++x) {
      const int64_t src_x = (flip ? OW - 1 - x : x) + dx;
      const bool inside = src_x >= 0 && src_x < W;
      for (int64_t c = 0; c < C; ++c) {
        const float v = inside ? row[src_x * C + c] : 0.0f;
        o[x * C + c] = store(v * scale[c] + shift[c]);
      }
    }
  }
}

}  // namespace

void apply_transform(const SplitInfo& info, const Transform& t, const uint8_t* image, uint64_t seed, int64_t epoch,
                     int64_t sample_index, void* out) {
  const int64_t C = info.channels;
  RT_CHECK(C <= 16, "transform: at most 16 channels, got ", C);
  std::array<float, 16> scale{}, shift{};
  for (int64_t c = 0; c < C; ++c) {
    const size_t k = static_cast<size_t>(c);
    const double mean = t.normalize && k < info.mean.size() ? info.mean[k] : 0.0;
    const double std = t.normalize && k < info.std.size() && info.std[k] > 0 ? info.std[k] : 1.0;
    scale[k] = static_cast<float>(1.0 / (255.0 * std));
    shift[k] = static_cast<float>(-mean / std);
  }
  if (t.dtype == DType::BF16)
    transform_into(info, t, image, seed, epoch, sample_index, static_cast<BFloat16*>(out), scale.data(), shift.data());
  else
    transform_into(info, t, image, seed, epoch, sample_index, static_cast<float*>(out), scale.data(), shift.data());
}

Loader::Loader(const ShardDataset& dataset, LoaderOptions options) : dataset_(dataset), options_(options) {
  const Transform& t = options_.transform;
  RT_CHECK(t.dtype == DType::F32 || t.dtype == DType::BF16, "loader: output dtype must be f32 or bf16, got ",
           dtype_name(t.dtype));
  RT_CHECK(t.pad_crop >= 0 && t.resized_crop >= 0, "loader: negative crop size");
  const SplitInfo& info = dataset.info();
  // A crop padded by more than the image is mostly padding: almost certainly a wrong flag.
  RT_CHECK(t.pad_crop <= std::min(info.height, info.width), "loader: pad_crop (--pad-crop) ", t.pad_crop,
           " is larger than the ", info.height, "x", info.width, " images of split '", info.split, "'");
  RT_CHECK(t.resized_crop <= 8192, "loader: resized_crop (--image-size) ", t.resized_crop, " is over 8192 pixels");
  RT_CHECK(options_.prefetch >= 1, "loader: prefetch must be >= 1, got ", options_.prefetch);
  threads_ = options_.threads > 0 ? options_.threads : std::max(1, num_threads() - 1);
  if (options_.device.is_cuda()) copy_stream_ = Stream::create(options_.device);
}

Loader::~Loader() { stop(); }

void Loader::stop() {
  // Host buffers of copies still running must outlive them.
  for (auto& f : in_flight_) f.done.synchronize();
  in_flight_.clear();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  produced_.notify_all();
  consumed_.notify_all();
  for (auto& w : workers_) w.join();
  workers_.clear();
}

void Loader::start(std::vector<std::vector<int64_t>> batches, int64_t epoch, int64_t first_batch) {
  stop();
  for (const auto& b : batches)
    for (int64_t i : b)
      if (i < -1 || i >= dataset_.size())
        RT_THROW("loader: record index ", i, " is out of range for split '", dataset_.info().split, "' of ",
                 dataset_.size(), " records");
  std::lock_guard<std::mutex> lock(mutex_);
  batches_ = std::move(batches);
  epoch_ = epoch;
  first_batch_ = first_batch;  // set before the workers start: they read it without the lock
  ready_.clear();
  next_to_build_ = next_to_deliver_ = 0;
  stopping_ = false;
  started_ = true;
  error_ = nullptr;
  for (int i = 0; i < threads_; ++i) workers_.emplace_back([this] { worker(); });
}

void Loader::start_epoch(DistributedSampler& sampler, int64_t epoch) {
  if (sampler.state().epoch != epoch) sampler.set_epoch(epoch);
  std::vector<std::vector<int64_t>> batches;
  std::vector<int64_t> indices;
  const int64_t first = sampler.state().next_batch;
  while (sampler.next(indices)) batches.push_back(indices);
  start(std::move(batches), epoch, first);
}

SamplerState Loader::position() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return SamplerState{epoch_, first_batch_ + next_to_deliver_};
}

Batch Loader::build(int64_t t) {
  const std::vector<int64_t>& indices = batches_[static_cast<size_t>(t)];
  const SplitInfo& info = dataset_.info();
  const auto shape = transformed_shape(info, options_.transform);
  const int64_t n = static_cast<int64_t>(indices.size());
  std::vector<int64_t> real;
  for (int64_t i : indices)
    if (i >= 0) real.push_back(i);
  std::vector<uint8_t> raw(static_cast<size_t>(static_cast<int64_t>(real.size()) * info.record_bytes()));
  std::vector<int32_t> labels(real.size());
  dataset_.read_indices(real, raw.data(), labels.data());
  Batch batch;
  batch.index = first_batch_ + t;
  batch.valid = static_cast<int64_t>(real.size());
  const Shape image_shape{n, shape[0], shape[1], shape[2]};
  // Every real slot is overwritten by its sample; only padding slots are zeroed below.
  if (options_.device.is_cuda()) {
    batch.images = Tensor::empty_pinned(image_shape, options_.transform.dtype);
    batch.labels = Tensor::empty_pinned(Shape{n}, DType::I64);
  } else {
    batch.images = Tensor::empty(image_shape, options_.transform.dtype);
    batch.labels = Tensor::empty(Shape{n}, DType::I64);
  }
  const int64_t sample_elems = shape[0] * shape[1] * shape[2];
  const int64_t elem_bytes = dtype_size(options_.transform.dtype);
  auto* out = static_cast<uint8_t*>(batch.images.data_ptr());
  int64_t* out_labels = batch.labels.data<int64_t>();
  // Real samples first (in the batch's order), padding (-1) after them.
  int64_t slot = 0;
  for (size_t k = 0; k < real.size(); ++k, ++slot) {
    apply_transform(info, options_.transform, raw.data() + k * static_cast<size_t>(info.record_bytes()), options_.seed,
                    epoch_, real[k], out + slot * sample_elems * elem_bytes);
    out_labels[slot] = labels[k];
  }
  if (slot < n) {
    std::fill(out + slot * sample_elems * elem_bytes, out + n * sample_elems * elem_bytes, uint8_t{0});
    std::fill(out_labels + slot, out_labels + n, int64_t{0});
  }
  return batch;
}

void Loader::worker() {
  for (;;) {
    int64_t t;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      consumed_.wait(lock, [&] {
        return stopping_ || next_to_build_ >= static_cast<int64_t>(batches_.size()) ||
               next_to_build_ < next_to_deliver_ + options_.prefetch;
      });
      if (stopping_ || next_to_build_ >= static_cast<int64_t>(batches_.size())) return;
      t = next_to_build_++;
    }
    try {
      Batch b = build(t);
      std::lock_guard<std::mutex> lock(mutex_);
      ready_.emplace(t, std::move(b));
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!error_) {
        try {
          RT_THROW("loader: batch ", first_batch_ + t, " of epoch ", epoch_, " (split '", dataset_.info().split,
                   "'): ", e.what());
        } catch (...) {
          error_ = std::current_exception();
        }
      }
      stopping_ = true;
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!error_) error_ = std::current_exception();
      stopping_ = true;
    }
    produced_.notify_all();
  }
}

std::optional<Batch> Loader::next() {
  std::unique_lock<std::mutex> lock(mutex_);
  if (next_to_deliver_ >= static_cast<int64_t>(batches_.size())) return std::nullopt;
  if (!started_) RT_THROW("loader: next() before start()");
  produced_.wait(lock, [&] { return error_ || ready_.count(next_to_deliver_) || stopping_; });
  if (error_) {
    std::exception_ptr e = error_;
    lock.unlock();
    stop();
    std::rethrow_exception(e);
  }
  if (stopping_) return std::nullopt;  // stopped: prefetched batches are dropped
  // Copy the handles out and deliver (which may fail: device memory) before the batch leaves the
  // queue, so a failed delivery can be retried instead of silently skipping the batch.
  Batch b = ready_.at(next_to_deliver_);
  lock.unlock();
  Batch delivered = options_.device.is_cuda() ? to_device(b) : b;
  lock.lock();
  ready_.erase(next_to_deliver_);
  ++next_to_deliver_;
  lock.unlock();
  consumed_.notify_all();
  return delivered;
}

Batch Loader::to_device(Batch host) {
  // Retire host buffers whose copies are done (at most `prefetch` in flight).
  while (static_cast<int>(in_flight_.size()) >= options_.prefetch) {
    in_flight_.front().done.synchronize();
    in_flight_.erase(in_flight_.begin());
  }
  const Device d = options_.device;
  const Stream compute = current_stream();
  // Device memory comes from the compute stream's pool; the copy stream first waits for the compute
  // stream so a reused block is no longer being read, then the compute stream waits for the copy.
  Batch out;
  out.index = host.index;
  out.valid = host.valid;
  out.images = Tensor::empty(host.images.shape(), host.images.dtype(), d);
  out.labels = Tensor::empty(host.labels.shape(), DType::I64, d);
  Event compute_ready = Event::create(d);
  compute_ready.record(compute);
  compute_ready.wait_on(copy_stream_);
  copy_bytes_async(out.images.data_ptr(), d, host.images.data_ptr(), Device::cpu(), host.images.nbytes(), copy_stream_);
  copy_bytes_async(out.labels.data_ptr(), d, host.labels.data_ptr(), Device::cpu(), host.labels.nbytes(), copy_stream_);
  Event copied = Event::create(d);
  copied.record(copy_stream_);
  copied.wait_on(compute);
  in_flight_.push_back(InFlight{copied, std::move(host)});
  return out;
}

}  // namespace ringtrain::data
