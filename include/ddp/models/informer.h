#pragma once
// A minimal Informer (Zhou et al., AAAI 2021) for multivariate time-series forecasting: the
// model of zhouhaoyi/Informer2020 with attn 'prob', embed 'fixed', gelu, distil and mix, and its
// module names, so that weights move to bench/informer_reference.py (Python) with strict=True:
//   enc_embedding, dec_embedding   DataEmbedding: value_embedding.tokenConv (circular Conv1d,
//                                  kernel 3) + sinusoidal position + fixed time-feature embedding
//   encoder.attn_layers.{i}        ProbSparse self-attention, conv1/conv2 (kernel-1 feed-forward),
//                                  norm1, norm2
//   encoder.conv_layers.{i}        distilling between layers: downConv, norm (BatchNorm1d), ELU,
//                                  max-pool with stride 2 (halves the length: ceil(L / 2))
//   encoder.norm, decoder.norm     LayerNorm
//   decoder.layers.{i}             masked ProbSparse self-attention (mix), full cross-attention,
//                                  conv1/conv2, norm1..norm3
//   projection                     Linear(d_model, c_out)
// One difference from Informer2020: the sinusoid tables are computed, not stored as parameters or
// buffers, so the state dict holds only what training changes (and DDP broadcasts nothing more).

#include <torch/nn/module.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace ddp::models {

struct InformerOptions {
  int64_t enc_in = 7;  // encoder input columns
  int64_t dec_in = 7;  // decoder input columns
  int64_t c_out = 7;   // output columns
  int64_t seq_len = 96;
  int64_t label_len = 48;
  int64_t pred_len = 24;
  int64_t factor = 5;  // ProbSparse sampling factor c: c * ceil(ln L) queries and keys
  int64_t d_model = 64;
  int64_t n_heads = 4;
  int64_t e_layers = 2;
  int64_t d_layers = 1;
  int64_t d_ff = 128;
  double dropout = 0.05;
};

// Informer's attention kernels. Queries [B, L, H, E], keys [B, S, H, E], values [B, S, H, D];
// the result is [B, L, H, D].
// Full attention, with the causal mask when `masked` (then L == S); `dropout` acts on the weights.
torch::Tensor full_attention(const torch::Tensor& queries, const torch::Tensor& keys,
                             const torch::Tensor& values, bool masked, torch::nn::Dropout& dropout);
// ProbSparse attention: the u = c * ceil(ln L) queries with the largest sparsity measure (from
// c * ceil(ln S) keys sampled per query with the default CPU generator) attend to all keys; the
// others get the mean of the values (unmasked) or their cumulative sum (masked, L == S). With u
// and the sample as large as L and S, every query attends and this is full attention.
torch::Tensor prob_attention(const torch::Tensor& queries, const torch::Tensor& keys,
                             const torch::Tensor& values, int64_t factor, bool masked);

class AttentionLayerImpl : public torch::nn::Module {
 public:
  // prob: ProbSparse (with factor), else full attention. mix: Informer's head mixing (the
  // decoder's self-attention).
  AttentionLayerImpl(bool prob, bool masked, const InformerOptions& o, bool mix);
  torch::Tensor forward(const torch::Tensor& queries, const torch::Tensor& keys,
                        const torch::Tensor& values);

 private:
  bool prob_, masked_, mix_;
  int64_t factor_, n_heads_;
  torch::nn::Dropout dropout_{nullptr};
  torch::nn::Linear query_projection_{nullptr}, key_projection_{nullptr},
      value_projection_{nullptr}, out_projection_{nullptr};
};
TORCH_MODULE(AttentionLayer);

class EncoderLayerImpl : public torch::nn::Module {
 public:
  explicit EncoderLayerImpl(const InformerOptions& o);
  torch::Tensor forward(const torch::Tensor& x);

 private:
  AttentionLayer attention_{nullptr};
  torch::nn::Conv1d conv1_{nullptr}, conv2_{nullptr};
  torch::nn::LayerNorm norm1_{nullptr}, norm2_{nullptr};
  torch::nn::Dropout dropout_{nullptr};
};
TORCH_MODULE(EncoderLayer);

// Distilling: [B, L, d] -> [B, ceil(L / 2), d].
class ConvLayerImpl : public torch::nn::Module {
 public:
  explicit ConvLayerImpl(int64_t channels);
  torch::Tensor forward(const torch::Tensor& x);

 private:
  torch::nn::Conv1d down_conv_{nullptr};
  torch::nn::BatchNorm1d norm_{nullptr};
};
TORCH_MODULE(ConvLayer);

class DecoderLayerImpl : public torch::nn::Module {
 public:
  explicit DecoderLayerImpl(const InformerOptions& o);
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cross);

 private:
  AttentionLayer self_attention_{nullptr}, cross_attention_{nullptr};
  torch::nn::Conv1d conv1_{nullptr}, conv2_{nullptr};
  torch::nn::LayerNorm norm1_{nullptr}, norm2_{nullptr}, norm3_{nullptr};
  torch::nn::Dropout dropout_{nullptr};
};
TORCH_MODULE(DecoderLayer);

// Values [B, L, c_in] and marks [B, L, 4] (month, day, weekday, hour) -> [B, L, d_model].
class DataEmbeddingImpl : public torch::nn::Module {
 public:
  DataEmbeddingImpl(int64_t c_in, int64_t d_model, double dropout);
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& marks);

 private:
  // The sinusoid table with at least `rows` rows on `options`' device, built once and kept (row p
  // does not depend on the table's length, so a longer one serves shorter inputs).
  const torch::Tensor& table(int64_t rows, const torch::TensorOptions& options);

  int64_t d_model_;
  torch::nn::Conv1d token_conv_{nullptr};
  torch::nn::Dropout dropout_{nullptr};
  torch::Tensor table_;  // not a buffer: derived from the sizes, never saved or broadcast
};
TORCH_MODULE(DataEmbedding);

class InformerImpl : public torch::nn::Module {
 public:
  // Throws InputError when d_model is odd or not a multiple of n_heads, or a size is < 1.
  explicit InformerImpl(const InformerOptions& options);
  // x_enc [B, seq_len, enc_in] with marks [B, seq_len, 4]; x_dec [B, label_len + pred_len,
  // dec_in] (the known label_len values, then zeros) with marks -> [B, pred_len, c_out].
  torch::Tensor forward(const torch::Tensor& x_enc, const torch::Tensor& x_mark_enc,
                        const torch::Tensor& x_dec, const torch::Tensor& x_mark_dec);
  // The encoder's output: [B, L', d_model], L' = seq_len halved (rounding up) e_layers - 1 times.
  torch::Tensor encode(const torch::Tensor& x_enc, const torch::Tensor& x_mark_enc);
  const InformerOptions& options() const { return options_; }
  // The encoder's and the decoder's layers in the order the forward calls them (each through
  // ddp::nn::call, so that a sharded model can gather each around its call).
  std::vector<std::shared_ptr<torch::nn::Module>> layers() const;

 private:
  InformerOptions options_;
  DataEmbedding enc_embedding_{nullptr}, dec_embedding_{nullptr};
  torch::nn::ModuleList attn_layers_{nullptr}, conv_layers_{nullptr}, decoder_layers_{nullptr};
  torch::nn::LayerNorm encoder_norm_{nullptr}, decoder_norm_{nullptr};
  torch::nn::Linear projection_{nullptr};
};
TORCH_MODULE(Informer);

// The sinusoid table of Informer's PositionalEmbedding and FixedEmbedding: T[p, 2i] =
// sin(p / 10000^(2i / d)), T[p, 2i + 1] = cos(the same); [n, d] float32.
torch::Tensor sinusoids(int64_t n, int64_t d, const torch::TensorOptions& options = {});

}  // namespace ddp::models
