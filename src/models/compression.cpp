#include "models/compression.h"

#include <cmath>
#include <string>

namespace ab::models {

CompressionConfig compression_ae() { return {}; }

CompressionConfig tiny_compression_ae() {
  CompressionConfig c;
  c.channels = 8;
  c.latent_channels = 6;
  c.kernel = 3;
  return c;
}

CompressionModel build_compression_ae(nn::GraphBuilder& b, const CompressionConfig& c, std::int64_t batch,
                                      std::int64_t image_px) {
  nn::Conv2dDesc strided;
  strided.stride_h = strided.stride_w = 2;
  strided.pad_h = strided.pad_w = c.kernel / 2;
  CompressionModel m;
  m.images = b.input("images", Shape{batch, c.in_channels, image_px, image_px});
  // Analysis transform: four stride-2 convolutions, each halving H and W (even sizes).
  nn::Value x = m.images;
  for (int i = 1; i <= 4; ++i) {
    const std::string name = "encoder.conv" + std::to_string(i);
    x = nn::conv2d(b, name, x, {i == 4 ? c.latent_channels : c.channels, c.kernel, c.kernel, strided});
    if (i < 4) x = nn::relu(b, name + ".relu", x);
  }
  m.latent = x;
  m.quantized = nn::quantize_ste(b, "quantize", m.latent, c.quant_step);
  // Synthesis transform: four stride-2 transposed convolutions; output_padding 1 doubles H and W.
  x = m.quantized;
  for (int i = 1; i <= 4; ++i) {
    const std::string name = "decoder.deconv" + std::to_string(i);
    nn::ConvTranspose2dAttrs a{i == 4 ? c.in_channels : c.channels, c.kernel, c.kernel, strided, 1, 1};
    x = nn::conv_transpose2d(b, name, x, a);
    if (i < 4) x = nn::relu(b, name + ".relu", x);
  }
  m.reconstruction = x;
  const nn::RateDistortion rd = nn::rate_distortion_loss(b, "loss", m.reconstruction, m.images, m.latent, {c.lambda});
  m.loss = rd.loss;
  m.mse = rd.mse;
  b.mark_output(m.reconstruction);
  b.mark_output(m.mse);
  if (b.options().training) b.set_loss(m.loss);
  else b.mark_output(m.loss);
  return m;
}

double psnr_db(double mse) { return 10.0 * std::log10(1.0 / mse); }  // peak (range) 1

}  // namespace ab::models
