// Convolution problem sizes as data (DeepBench's habit): named rows in named tables, selected on
// the command line as `--axis shape=@deepbench-train` (a table) or `--axis shape=resnet50.conv1`
// (one row); the shape arithmetic (output size, FLOPs, bytes) every conv point and test uses.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace ab::workloads::micro {

// One 2-D convolution in cuDNN's names: input N x C x H x W, K filters of C x R x S (R rows,
// S columns), zero padding and strides per dimension; groups 1, dilation 1.
struct ConvShape {
  std::int64_t n = 0, c = 0, h = 0, w = 0, k = 0, r = 0, s = 0;
  std::int64_t pad_h = 0, pad_w = 0, stride_h = 1, stride_w = 1;
  std::int64_t p() const { return (h + 2 * pad_h - r) / stride_h + 1; }  // output rows
  std::int64_t q() const { return (w + 2 * pad_w - s) / stride_w + 1; }  // output columns
  std::string to_string() const;  // "n=16 c=3 h=224 w=224 k=64 r=7 s=7 pad=3x3 stride=2x2 -> p=112 q=112"
};

struct NamedConvShape {
  std::string name;  // "deepbench-train.1", "resnet50.conv1"
  ConvShape shape;
};

// Table name -> its rows in order.
const std::map<std::string, std::vector<NamedConvShape>>& conv_tables();
// The row called `name` in any table; nullopt when none is.
std::optional<ConvShape> find_conv_shape(const std::string& name);
// The tables as the `shape` axis's zip group wants them: table name -> rows of {row name}.
std::map<std::string, std::vector<std::vector<std::string>>> conv_shape_axis_tables();

// Throws UsageError naming the first bad field: sizes below 1, negative padding, strides below 1,
// or a filter larger than the padded input (P or Q would be <= 0).
void check_conv_shape(const ConvShape& s);

// 2 N K P Q C R S (a multiply-add is 2): the same count for forward, backward data and backward
// filter, each being one such contraction. Checked for overflow (UsageError).
std::int64_t conv_flops(const ConvShape& s);
// Elements of the input, filters and output; checked for overflow (UsageError).
struct ConvElements {
  std::int64_t x = 0, w = 0, y = 0;
};
ConvElements conv_elements(const ConvShape& s);

}  // namespace ab::workloads::micro
