// A convolutional image-compression autoencoder in the style of Balle et al. (ICLR 2017, 2018):
// a strided-convolution encoder (analysis transform), a uniformly quantised latent with a
// straight-through gradient in training, and a transposed-convolution decoder (synthesis
// transform), trained on a rate-distortion proxy: mse(x_hat, x) + lambda * mean(|latent|).
//
// Departures from the papers, all for lack of the pieces in the engine: ReLU instead of GDN/IGDN,
// no biases (the engine's convolutions have none), and an L1 rate proxy instead of a learned
// entropy model (nn::RateDistortionLoss says why it is a proxy). Images are [N, 3, H, W] with H
// and W multiples of 16 (four stride-2 stages), centred: values in [-0.5, 0.5], a range of 1 (an
// 8-bit image as x / 255 - 0.5). Without biases a ReLU network cannot add the offset of [0, 1]
// images; centring is the fixed bias, and PSNR depends only on the range (peak 1).
#pragma once

#include <cstdint>

#include "nn/graph.h"
#include "nn/ops.h"

namespace ab::models {

struct CompressionConfig {
  std::int64_t in_channels = 3;
  std::int64_t channels = 128;         // N: hidden channels (Balle 2017/2018: 128 at low rates)
  std::int64_t latent_channels = 192;  // M: latent channels (Balle 2018's 192 with N = 128)
  std::int64_t kernel = 5;             // 5x5 throughout, stride 2, padding 2
  // The quantiser's bin width on the latent. The He-initialised encoder's latent starts with a
  // standard deviation of about 0.03 on these images; bins of 1 would round it all to 0, and with
  // ReLU and no biases a zero latent gives a zero reconstruction and no gradient anywhere: a
  // latent inside the dead zone never recovers. 2^-8 gives the untrained latent about ten bins
  // per standard deviation (2^-5 let the tiny model's latent collapse within 20 steps); a power
  // of two keeps step * round(x / step) exact.
  double quant_step = 1.0 / 256.0;
  // Rate weight. Larger values (0.01) drove the tiny model's whole latent into the dead zone
  // before the decoder had learnt to use it.
  double lambda = 1e-3;
};

// N = 128, M = 192 (2,886,400 parameters, no biases).
CompressionConfig compression_ae();
// Few channels for 16x16 images on the reference backend (tests, CI).
CompressionConfig tiny_compression_ae();

struct CompressionModel {
  nn::Value images;          // [N, C, H, W] in [-0.5, 0.5]: input and target
  nn::Value latent;          // the encoder's output, before quantisation
  nn::Value quantized;       // the quantised latent the decoder reads
  nn::Value reconstruction;  // x_hat [N, C, H, W]
  nn::Value loss, mse;       // rate-distortion proxy (the graph's loss where training) and distortion
};

// Adds the encoder, quantiser, decoder and loss to `b` (the loss is set as the graph's loss on a
// training graph; reconstruction, loss and mse are kept readable). Layer names: "encoder.conv1"..4,
// "quantize", "decoder.deconv1"..4, "loss".
CompressionModel build_compression_ae(nn::GraphBuilder& b, const CompressionConfig& c, std::int64_t batch,
                                      std::int64_t image_px);

// PSNR in dB of a reconstruction with mean squared error `mse` on images whose range is 1:
// 10 log10(1 / mse).
double psnr_db(double mse);

}  // namespace ab::models
