// 2-D convolutions and their two gradients as XLA FFI handlers that run oneDNN's CPU kernels.
//
// Built and loaded by onednn.py. Activations are NHWC and kernels HWIO (flax's layouts); every
// leading dimension before the last four is a group (a client of a vmapped chunk, a run of a
// batch), convolved with its own kernel. Attributes: strides (sh, sw) and explicit paddings
// (pt, pb, pl, pr).
//   fedjax_sel_conv_fwd:         (x [..., N, H, W, C], w [..., KH, KW, C, O])
//                                -> y [..., N, OH, OW, O]
//   fedjax_sel_conv_bwd_data:    (dy, w) -> dx
//   fedjax_sel_conv_bwd_weights: (x, dy) -> dw
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include "oneapi/dnnl/dnnl.hpp"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;
using dnnl::memory;
using Tag = dnnl::memory::format_tag;
using Type = dnnl::memory::data_type;

namespace {

dnnl::engine& Engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

// One group's convolution: shapes, strides and paddings.
struct Geometry {
  int64_t groups, n, h, w, c, kh, kw, o, oh, ow, sh, sw, pt, pb, pl, pr;

  auto Key() const { return std::make_tuple(n, h, w, c, kh, kw, o, sh, sw, pt, pb, pl, pr); }
  memory::desc Src() const { return memory::desc({n, c, h, w}, Type::f32, Tag::nhwc); }
  memory::desc Dst() const { return memory::desc({n, o, oh, ow}, Type::f32, Tag::nhwc); }
  memory::desc Weights() const { return memory::desc({o, c, kh, kw}, Type::f32, Tag::hwio); }
  // Lets oneDNN pick the kernel's blocked weight layout; weights are reordered to and from it.
  memory::desc AnyWeights() const { return memory::desc({o, c, kh, kw}, Type::f32, Tag::any); }
  int64_t SrcSize() const { return n * h * w * c; }
  int64_t DstSize() const { return n * oh * ow * o; }
  int64_t WeightsSize() const { return kh * kw * c * o; }
};

// The three primitives of one geometry with their weight reorders, built once per process.
struct Primitives {
  dnnl::convolution_forward::primitive_desc fwd_pd;
  dnnl::convolution_forward fwd;
  dnnl::reorder to_fwd_weights;
  dnnl::convolution_backward_data::primitive_desc bwd_data_pd;
  dnnl::convolution_backward_data bwd_data;
  dnnl::reorder to_bwd_data_weights;
  dnnl::convolution_backward_weights::primitive_desc bwd_weights_pd;
  dnnl::convolution_backward_weights bwd_weights;
  dnnl::reorder from_bwd_weights;
};

dnnl::reorder Reorder(const memory::desc& from, const memory::desc& to) {
  return dnnl::reorder(dnnl::reorder::primitive_desc(Engine(), from, Engine(), to));
}

Primitives& Lookup(const Geometry& g) {
  static std::mutex mu;
  static std::map<decltype(g.Key()), std::unique_ptr<Primitives>> cache;
  std::lock_guard<std::mutex> lock(mu);
  std::unique_ptr<Primitives>& slot = cache[g.Key()];
  if (slot) return *slot;
  dnnl::engine& e = Engine();
  // Scratchpads are ours (per call), so calls may run concurrently on XLA's threads.
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  const memory::dims strides = {g.sh, g.sw}, pad_l = {g.pt, g.pl}, pad_r = {g.pb, g.pr};
  auto p = std::make_unique<Primitives>();
  p->fwd_pd = dnnl::convolution_forward::primitive_desc(
      e, dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct, g.Src(),
      g.AnyWeights(), g.Dst(), strides, pad_l, pad_r, attr);
  p->fwd = dnnl::convolution_forward(p->fwd_pd);
  p->to_fwd_weights = Reorder(g.Weights(), p->fwd_pd.weights_desc());
  p->bwd_data_pd = dnnl::convolution_backward_data::primitive_desc(
      e, dnnl::algorithm::convolution_direct, g.Src(), g.AnyWeights(), g.Dst(), strides, pad_l,
      pad_r, p->fwd_pd, attr);
  p->bwd_data = dnnl::convolution_backward_data(p->bwd_data_pd);
  p->to_bwd_data_weights = Reorder(g.Weights(), p->bwd_data_pd.weights_desc());
  p->bwd_weights_pd = dnnl::convolution_backward_weights::primitive_desc(
      e, dnnl::algorithm::convolution_direct, g.Src(), g.AnyWeights(), g.Dst(), strides, pad_l,
      pad_r, p->fwd_pd, attr);
  p->bwd_weights = dnnl::convolution_backward_weights(p->bwd_weights_pd);
  p->from_bwd_weights = Reorder(p->bwd_weights_pd.diff_weights_desc(), g.Weights());
  slot = std::move(p);
  return *slot;
}

memory Scratchpad(const memory::desc& desc) {
  thread_local std::vector<uint8_t> buffer;
  if (buffer.size() < desc.get_size()) buffer.resize(desc.get_size());
  return memory(desc, Engine(), buffer.data());
}

using Dims = ffi::AnyBuffer::Dimensions;

ffi::Unexpected<ffi::Error> Invalid(const char* message) {
  return ffi::Unexpected<ffi::Error>(ffi::Error(ffi::ErrorCode::kInvalidArgument, message));
}

ffi::ErrorOr<Geometry> Shape(Dims x, Dims w, Dims y, int64_t sh, int64_t sw, int64_t pt,
                             int64_t pb, int64_t pl, int64_t pr) {
  const size_t rx = x.size(), rw = w.size(), ry = y.size();
  if (rx < 4 || rx != rw || rx != ry) {
    return Invalid("conv: ranks of x, w, y disagree");
  }
  Geometry g;
  g.groups = 1;
  for (size_t i = 0; i + 4 < rx; ++i) {
    if (x[i] != w[i] || x[i] != y[i]) {
      return Invalid("conv: group dimensions disagree");
    }
    g.groups *= x[i];
  }
  g.n = x[rx - 4], g.h = x[rx - 3], g.w = x[rx - 2], g.c = x[rx - 1];
  g.kh = w[rw - 4], g.kw = w[rw - 3], g.o = w[rw - 1];
  g.oh = y[ry - 3], g.ow = y[ry - 2];
  g.sh = sh, g.sw = sw, g.pt = pt, g.pb = pb, g.pl = pl, g.pr = pr;
  if (w[rw - 2] != g.c || y[ry - 4] != g.n || y[ry - 1] != g.o) {
    return Invalid("conv: channel or batch sizes disagree");
  }
  return g;
}

enum class Direction { kForward, kBackwardData, kBackwardWeights };

// One direction over every group. x, w, y: the convolution's activations, kernel and output, of
// which `out` names the result (y forward, x for the input gradient, w for the kernel gradient).
ffi::Error Convolve(Direction direction, Dims x_dims, Dims w_dims, Dims y_dims, const float* x,
                    const float* w, const float* y, float* out, int64_t sh, int64_t sw,
                    int64_t pt, int64_t pb, int64_t pl, int64_t pr) {
  auto shape = Shape(x_dims, w_dims, y_dims, sh, sw, pt, pb, pl, pr);
  if (shape.has_error()) return shape.error();
  const Geometry& g = shape.value();
  Primitives& p = Lookup(g);
  dnnl::engine& e = Engine();
  dnnl::stream s(e);
  // The kernel in the direction's own layout, and its primitive's scratchpad.
  memory::desc blocked_desc, scratch_desc;
  switch (direction) {
    case Direction::kForward:
      blocked_desc = p.fwd_pd.weights_desc();
      scratch_desc = p.fwd_pd.scratchpad_desc();
      break;
    case Direction::kBackwardData:
      blocked_desc = p.bwd_data_pd.weights_desc();
      scratch_desc = p.bwd_data_pd.scratchpad_desc();
      break;
    case Direction::kBackwardWeights:
      blocked_desc = p.bwd_weights_pd.diff_weights_desc();
      scratch_desc = p.bwd_weights_pd.scratchpad_desc();
      break;
  }
  memory blocked(blocked_desc, e);
  memory scratch = Scratchpad(scratch_desc);
  // Each group's result is written through `out`, its operands read through the others.
  float* xs = direction == Direction::kBackwardData ? out : const_cast<float*>(x);
  float* ws = direction == Direction::kBackwardWeights ? out : const_cast<float*>(w);
  float* ys = direction == Direction::kForward ? out : const_cast<float*>(y);
  for (int64_t i = 0; i < g.groups; ++i) {
    memory src(g.Src(), e, xs + i * g.SrcSize());
    memory dst(g.Dst(), e, ys + i * g.DstSize());
    memory kernel(g.Weights(), e, ws + i * g.WeightsSize());
    switch (direction) {
      case Direction::kForward:
        p.to_fwd_weights.execute(s, kernel, blocked);
        p.fwd.execute(s, {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, blocked}, {DNNL_ARG_DST, dst},
                          {DNNL_ARG_SCRATCHPAD, scratch}});
        break;
      case Direction::kBackwardData:
        p.to_bwd_data_weights.execute(s, kernel, blocked);
        p.bwd_data.execute(s, {{DNNL_ARG_DIFF_DST, dst}, {DNNL_ARG_WEIGHTS, blocked},
                               {DNNL_ARG_DIFF_SRC, src}, {DNNL_ARG_SCRATCHPAD, scratch}});
        break;
      case Direction::kBackwardWeights:
        p.bwd_weights.execute(s, {{DNNL_ARG_SRC, src}, {DNNL_ARG_DIFF_DST, dst},
                                  {DNNL_ARG_DIFF_WEIGHTS, blocked},
                                  {DNNL_ARG_SCRATCHPAD, scratch}});
        p.from_bwd_weights.execute(s, blocked, kernel);
        break;
    }
  }
  s.wait();
  return ffi::Error::Success();
}

ffi::Error Forward(ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> w,
                   ffi::ResultBuffer<ffi::F32> y, int64_t sh, int64_t sw, int64_t pt, int64_t pb,
                   int64_t pl, int64_t pr) {
  return Convolve(Direction::kForward, x.dimensions(), w.dimensions(), y->dimensions(),
                  x.typed_data(), w.typed_data(), nullptr, y->typed_data(), sh, sw, pt, pb, pl,
                  pr);
}

ffi::Error BackwardData(ffi::Buffer<ffi::F32> dy, ffi::Buffer<ffi::F32> w,
                        ffi::ResultBuffer<ffi::F32> dx, int64_t sh, int64_t sw, int64_t pt,
                        int64_t pb, int64_t pl, int64_t pr) {
  return Convolve(Direction::kBackwardData, dx->dimensions(), w.dimensions(), dy.dimensions(),
                  nullptr, w.typed_data(), dy.typed_data(), dx->typed_data(), sh, sw, pt, pb, pl,
                  pr);
}

ffi::Error BackwardWeights(ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> dy,
                           ffi::ResultBuffer<ffi::F32> dw, int64_t sh, int64_t sw, int64_t pt,
                           int64_t pb, int64_t pl, int64_t pr) {
  return Convolve(Direction::kBackwardWeights, x.dimensions(), dw->dimensions(), dy.dimensions(),
                  x.typed_data(), nullptr, dy.typed_data(), dw->typed_data(), sh, sw, pt, pb, pl,
                  pr);
}

}  // namespace

#define CONV_BINDING                                                                  \
  ffi::Ffi::Bind()                                                                    \
      .Arg<ffi::Buffer<ffi::F32>>()                                                   \
      .Arg<ffi::Buffer<ffi::F32>>()                                                   \
      .Ret<ffi::Buffer<ffi::F32>>()                                                   \
      .Attr<int64_t>("sh")                                                            \
      .Attr<int64_t>("sw")                                                            \
      .Attr<int64_t>("pt")                                                            \
      .Attr<int64_t>("pb")                                                            \
      .Attr<int64_t>("pl")                                                            \
      .Attr<int64_t>("pr")

XLA_FFI_DEFINE_HANDLER_SYMBOL(FedjaxSelConvForward, Forward, CONV_BINDING);
XLA_FFI_DEFINE_HANDLER_SYMBOL(FedjaxSelConvBackwardData, BackwardData, CONV_BINDING);
XLA_FFI_DEFINE_HANDLER_SYMBOL(FedjaxSelConvBackwardWeights, BackwardWeights, CONV_BINDING);
