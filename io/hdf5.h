// io/hdf5.h: the HDF5 toolkit of the library (checkpoints in io/, shards in data/): a move-only id
// handle, a checking helper whose errors name the kind of file, the file and the object, attribute
// helpers, and H5_CHECK (the HDF5 adapter of core/check.h's macro family). Every call's result is checked;
// HDF5's own stack printing is off and its stack is translated into the message. The serial HDF5 library
// is not thread-safe: callers hold lock() around every use (loader threads read shards while the training
// thread writes a checkpoint).
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <filesystem>
#include <mutex>
#include <string>
#include <vector>

#include "core/check.h"

namespace ringtrain::h5 {

// The one lock every HDF5 call in the process takes.
std::recursive_mutex& lock();
// HDF5's error stack as one line ("desc [function]; ..."), which it then clears.
std::string error_text();
// Turns off HDF5's automatic stack printing (the stack is translated into messages instead).
void silence_errors();

// Owns an HDF5 id and closes it (never throws; a failed close is reported on stderr).
class Id {
 public:
  Id() = default;
  Id(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
  Id(Id&& o) noexcept : id_(o.id_), close_(o.close_) { o.id_ = H5I_INVALID_HID; }
  Id& operator=(Id&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = o.id_;
      close_ = o.close_;
      o.id_ = H5I_INVALID_HID;
    }
    return *this;
  }
  Id(const Id&) = delete;
  Id& operator=(const Id&) = delete;
  ~Id() { reset(); }

  hid_t get() const { return id_; }
  operator hid_t() const { return id_; }
  bool valid() const { return id_ >= 0; }
  // Gives up ownership.
  hid_t release() {
    const hid_t id = id_;
    id_ = H5I_INVALID_HID;
    return id;
  }
  void reset() noexcept;

 private:
  hid_t id_ = H5I_INVALID_HID;
  herr_t (*close_)(hid_t) = nullptr;
};

// Where an error happened: "shard 'f.h5', object '/labels'", "checkpoint 'c.h5'".
struct Where {
  const char* kind;  // "shard", "checkpoint"
  std::filesystem::path file;
  std::string object = {};
  Where at(std::string obj) const { return Where{kind, file, std::move(obj)}; }
  std::string text() const;
};

// Throws "<where>: <what> (HDF5: <stack>)" when result < 0; returns result otherwise.
[[noreturn]] void fail(const Where& where, const std::string& what);
template <typename T>
T check(T result, const Where& where, const std::string& what) {
  if (result < 0) fail(where, what);
  return result;
}

// Checked existence tests (a negative answer of HDF5 itself is an error, not "absent").
bool link_exists(hid_t loc, const char* name, const Where& where);
bool attribute_exists(hid_t loc, const char* name, const Where& where);

// Attributes. Writers replace an existing attribute. Readers raise "<where>: missing attribute '<name>'".
void write_string_attribute(hid_t loc, const char* name, const std::string& value, const Where& where);
std::string read_string_attribute(hid_t loc, const char* name, const Where& where);
// One-element arrays are written as scalars (how h5py shows them).
void write_int_attribute(hid_t loc, const char* name, const std::vector<int32_t>& values, const Where& where);
void write_float_attribute(hid_t loc, const char* name, const std::vector<float>& values, const Where& where);
std::vector<int32_t> read_int_attribute(hid_t loc, const char* name, const Where& where);
std::vector<float> read_float_attribute(hid_t loc, const char* name, const Where& where);

// The shape of a dataset's dataspace, checked (rank at most `max_rank`).
std::vector<hsize_t> dims(hid_t dataset, const Where& where, int max_rank = 8);

}  // namespace ringtrain::h5

// HDF5: herr_t and hid_t are negative on failure; the text comes from HDF5's error stack.
#define RT_DETAIL_H5_OK(s) ((s) >= 0)
#define RT_DETAIL_H5_TEXT(s) ::ringtrain::h5::error_text()
#define H5_CHECK(call) RT_CALL_CHECK_T("HDF5", call, #call, RT_DETAIL_H5_OK, RT_DETAIL_H5_TEXT, RT_DETAIL_NO_DEVICE)
#define H5_CHECK_NOTHROW(call) \
  RT_CALL_CHECK_NOTHROW_T("HDF5", call, #call, RT_DETAIL_H5_OK, RT_DETAIL_H5_TEXT, RT_DETAIL_NO_DEVICE)
