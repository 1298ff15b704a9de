// GPT dataset index helpers, compiled by `gptforge build helpers` (pybind11).
//
// build_sample_idx_int32 / build_sample_idx_int64 and build_blending_indices compute exactly what
// Megatron-LM's megatron/core/datasets/helpers.cpp computes for the same arguments; the NumPy
// reference in gptforge/data/sample_index.py is held equal to this file by a property test.
// Bad input raises ValueError instead of failing an assert.

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace py = pybind11;

using Int32Array = py::array_t<int32_t, py::array::c_style | py::array::forcecast>;

// Rows (i, offset), one per sample boundary: sample j spans rows j..j+1 of the documents
// document_idx laid end to end, each sample seq_length + extra tokens long, consecutive samples
// sharing `extra` tokens.
template <typename T>
py::array_t<T> build_sample_idx(const Int32Array &sizes_, const Int32Array &document_idx_, int32_t seq_length,
                                int32_t num_epochs, int64_t tokens_per_epoch, bool drop_last_partial_sequence = true,
                                int add_extra_token_to_sequence = 1) {
  if (seq_length < 1 || num_epochs < 1 || tokens_per_epoch < 1 || add_extra_token_to_sequence < 0) {
    throw std::invalid_argument("seq_length, num_epochs and tokens_per_epoch must be positive");
  }
  const int64_t n_docs = document_idx_.shape(0);
  if (n_docs == 0) throw std::invalid_argument("document_idx is empty");
  auto sizes = sizes_.unchecked<1>();
  auto document_idx = document_idx_.unchecked<1>();
  const int64_t n_sizes = sizes_.shape(0);
  for (int64_t k = 0; k < n_docs; ++k) {
    if (document_idx(k) < 0 || document_idx(k) >= n_sizes) {
      throw std::invalid_argument("document_idx[" + std::to_string(k) + "] is outside sizes");
    }
  }

  const int32_t extra = add_extra_token_to_sequence;
  const int64_t total = static_cast<int64_t>(num_epochs) * tokens_per_epoch;
  int64_t num_samples;
  if (drop_last_partial_sequence) {
    num_samples = (total - extra) / seq_length;
  } else {
    // single precision on purpose: this is the rounding Megatron's helpers use
    num_samples = static_cast<int64_t>(std::ceil(static_cast<float>(total - extra) / seq_length));
  }
  if (num_samples < 0) throw std::invalid_argument("fewer tokens than one sample");

  py::array_t<T> result({num_samples + 1, static_cast<int64_t>(2)});
  T *rows = result.mutable_data();
  bool short_of_tokens = false;
  {
    py::gil_scoped_release release;
    int64_t doc = 0;     // position in document_idx
    int64_t offset = 0;  // token offset inside that document
    rows[0] = 0;
    rows[1] = 0;
    for (int64_t sample = 1; sample <= num_samples; ++sample) {
      int64_t remaining = seq_length + extra;
      while (remaining != 0) {
        const int64_t length = sizes(document_idx(doc)) - offset;
        remaining -= length;
        if (remaining <= 0) {
          offset += remaining + length - extra;  // the next sample starts `extra` tokens back
          remaining = 0;
        } else if (doc == n_docs - 1) {  // out of documents: only the partial last sample may end here
          short_of_tokens = sample != num_samples || drop_last_partial_sequence;
          offset = sizes(document_idx(doc)) - extra;
          break;
        } else {
          ++doc;
          offset = 0;
        }
      }
      if (short_of_tokens) break;
      rows[2 * sample] = static_cast<T>(doc);
      rows[2 * sample + 1] = static_cast<T>(offset);
    }
  }
  if (short_of_tokens) throw std::invalid_argument("the documents hold fewer tokens than num_epochs * tokens_per_epoch");
  return result;
}

// Greedy blend: sample i comes from the dataset furthest below its share weights[d] * max(i, 1);
// ties go to the lower index.
void build_blending_indices(py::array_t<int16_t> &dataset_index, py::array_t<int64_t> &dataset_sample_index,
                            const py::array_t<double, py::array::c_style | py::array::forcecast> &weights,
                            int32_t num_datasets, int64_t size, bool verbose) {
  if (num_datasets < 1 || weights.shape(0) < num_datasets) throw std::invalid_argument("need one weight per dataset");
  if (dataset_index.shape(0) < size || dataset_sample_index.shape(0) < size) {
    throw std::invalid_argument("output arrays are shorter than size");
  }
  auto out_dataset = dataset_index.mutable_unchecked<1>();
  auto out_sample = dataset_sample_index.mutable_unchecked<1>();
  auto w = weights.unchecked<1>();
  std::vector<int64_t> counts(num_datasets, 0);
  for (int64_t i = 0; i < size; ++i) {
    const double x = std::max(static_cast<double>(i), 1.0);
    int32_t best = 0;
    double best_error = w(0) * x - static_cast<double>(counts[0]);
    for (int32_t d = 1; d < num_datasets; ++d) {
      const double error = w(d) * x - static_cast<double>(counts[d]);
      if (error > best_error) {
        best_error = error;
        best = d;
      }
    }
    out_dataset(i) = static_cast<int16_t>(best);
    out_sample(i) = counts[best];
    ++counts[best];
  }
  if (verbose) {
    for (int32_t d = 0; d < num_datasets; ++d) {
      py::print("dataset", d, "weight", w(d), "achieved", static_cast<double>(counts[d]) / static_cast<double>(size));
    }
  }
}

PYBIND11_MODULE(gptforge_helpers, m) {
  m.doc() = "GPT dataset index helpers (sample index, blending indices)";
  m.def("build_sample_idx_int32", &build_sample_idx<int32_t>, py::arg("sizes"), py::arg("document_idx"),
        py::arg("seq_length"), py::arg("num_epochs"), py::arg("tokens_per_epoch"),
        py::arg("drop_last_partial_sequence") = true, py::arg("add_extra_token_to_sequence") = 1);
  m.def("build_sample_idx_int64", &build_sample_idx<int64_t>, py::arg("sizes"), py::arg("document_idx"),
        py::arg("seq_length"), py::arg("num_epochs"), py::arg("tokens_per_epoch"),
        py::arg("drop_last_partial_sequence") = true, py::arg("add_extra_token_to_sequence") = 1);
  m.def("build_blending_indices", &build_blending_indices, py::arg("dataset_index"), py::arg("dataset_sample_index"),
        py::arg("weights"), py::arg("num_datasets"), py::arg("size"), py::arg("verbose") = false);
}
