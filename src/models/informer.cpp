#include "ddp/models/informer.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "ddp/common/error.h"
#include "ddp/nn/forward_hooks.h"

namespace ddp::models {
namespace {

namespace F = torch::nn::functional;

// Informer's ConvLayer and TokenEmbedding: kernel 3, circular padding 1 (the length stays).
torch::nn::Conv1d circular_conv(int64_t in, int64_t out) {
  return torch::nn::Conv1d(
      torch::nn::Conv1dOptions(in, out, 3).padding(1).padding_mode(torch::kCircular));
}

// The feed-forward block of both layer kinds: kernel-1 convolutions over [B, d, L].
torch::Tensor feed_forward(const torch::Tensor& y, torch::nn::Conv1d& conv1,
                           torch::nn::Conv1d& conv2, torch::nn::Dropout& dropout) {
  auto h = dropout(torch::gelu(conv1(y.transpose(-1, 1))));
  return dropout(conv2(h).transpose(-1, 1));
}

// c * ceil(ln n), at most n: how many queries ProbSparse keeps and keys it samples. At least one,
// where Informer2020 would take none at n = 1 (and fail on an empty sample).
int64_t prob_count(int64_t factor, int64_t n) {
  const auto log_n = static_cast<int64_t>(std::ceil(std::log(static_cast<double>(n))));
  return std::clamp<int64_t>(factor * log_n, 1, n);
}

}  // namespace

torch::Tensor sinusoids(int64_t n, int64_t d, const torch::TensorOptions& options) {
  const auto o = options.dtype(torch::kFloat);
  auto position = torch::arange(n, o).unsqueeze(1);
  auto div = torch::exp(torch::arange(0, d, 2, o) * -(std::log(10000.0) / static_cast<double>(d)));
  // Interleaved: column 2i is the sine, 2i + 1 the cosine.
  return torch::stack({torch::sin(position * div), torch::cos(position * div)}, -1).view({n, d});
}

torch::Tensor full_attention(const torch::Tensor& queries, const torch::Tensor& keys,
                             const torch::Tensor& values, bool masked,
                             torch::nn::Dropout& dropout) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(queries.size(3)));
  auto scores = torch::matmul(queries.transpose(1, 2), keys.transpose(1, 2).transpose(-2, -1));
  if (masked) {
    auto causal = torch::ones({scores.size(2), scores.size(3)},
                              torch::TensorOptions(torch::kBool).device(scores.device()))
                      .triu(1);
    scores = scores.masked_fill(causal, -std::numeric_limits<float>::infinity());
  }
  auto weights = dropout(torch::softmax(scores * scale, -1));
  return torch::matmul(weights, values.transpose(1, 2)).transpose(1, 2).contiguous();
}

torch::Tensor prob_attention(const torch::Tensor& queries, const torch::Tensor& keys,
                             const torch::Tensor& values, int64_t factor, bool masked) {
  const int64_t B = queries.size(0), L = queries.size(1), H = queries.size(2), E = queries.size(3);
  const int64_t S = keys.size(1), D = values.size(3);
  auto q = queries.transpose(1, 2);  // [B, H, L, E]
  auto k = keys.transpose(1, 2);
  auto v = values.transpose(1, 2);
  const int64_t sampled = prob_count(factor, S);
  const int64_t top_n = prob_count(factor, L);

  // The sparsity measure of each query from a sample of the keys: max minus mean of its scores
  // (Informer divides the sampled sum by S, not by the sample size; kept as it is).
  auto sample = torch::randint(S, {L * sampled}, torch::kLong).to(q.device());
  auto k_sample = k.index_select(2, sample).view({B, H, L, sampled, E});
  auto qk_sample = torch::matmul(q.unsqueeze(-2), k_sample.transpose(-2, -1)).squeeze(-2);
  auto measure = std::get<0>(qk_sample.max(-1)) - qk_sample.sum(-1) / static_cast<double>(S);
  auto top = std::get<1>(measure.topk(top_n, -1, /*largest=*/true, /*sorted=*/false));

  // The chosen queries attend to every key.
  auto q_top = q.gather(2, top.unsqueeze(-1).expand({B, H, top_n, E}));
  auto scores = torch::matmul(q_top, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(E));
  if (masked) {  // query at position p sees keys 0..p
    auto key_positions = torch::arange(S, top.options()).view({1, 1, 1, S});
    scores = scores.masked_fill(key_positions > top.unsqueeze(-1),
                                -std::numeric_limits<float>::infinity());
  }
  auto attended = torch::matmul(torch::softmax(scores, -1), v);

  // The others keep the lazy context: the mean of the values, or their running sum when masked.
  TORCH_CHECK(!masked || L == S, "masked ProbSparse attention is self-attention (L == S)");
  auto context = masked ? v.cumsum(-2) : v.mean(-2, /*keepdim=*/true).expand({B, H, L, D});
  context = context.scatter(2, top.unsqueeze(-1).expand({B, H, top_n, D}), attended);
  return context.transpose(1, 2).contiguous();
}

AttentionLayerImpl::AttentionLayerImpl(bool prob, bool masked, const InformerOptions& o, bool mix)
    : prob_(prob), masked_(masked), mix_(mix), factor_(o.factor), n_heads_(o.n_heads) {
  dropout_ = register_module("dropout", torch::nn::Dropout(o.dropout));
  query_projection_ = register_module("query_projection", torch::nn::Linear(o.d_model, o.d_model));
  key_projection_ = register_module("key_projection", torch::nn::Linear(o.d_model, o.d_model));
  value_projection_ = register_module("value_projection", torch::nn::Linear(o.d_model, o.d_model));
  out_projection_ = register_module("out_projection", torch::nn::Linear(o.d_model, o.d_model));
}

torch::Tensor AttentionLayerImpl::forward(const torch::Tensor& queries, const torch::Tensor& keys,
                                          const torch::Tensor& values) {
  const int64_t B = queries.size(0), L = queries.size(1), S = keys.size(1);
  auto q = query_projection_(queries).view({B, L, n_heads_, -1});
  auto k = key_projection_(keys).view({B, S, n_heads_, -1});
  auto v = value_projection_(values).view({B, S, n_heads_, -1});
  auto out = prob_ ? prob_attention(q, k, v, factor_, masked_)
                   : full_attention(q, k, v, masked_, dropout_);
  // Informer's "mix": the heads-first memory read as [B, L, H * D], which mixes positions and
  // heads; kept for weight compatibility with the original.
  if (mix_) out = out.transpose(2, 1).contiguous();
  return out_projection_(out.view({B, L, -1}));
}

EncoderLayerImpl::EncoderLayerImpl(const InformerOptions& o) {
  attention_ = register_module("attention", AttentionLayer(true, false, o, false));
  conv1_ = register_module("conv1", torch::nn::Conv1d(o.d_model, o.d_ff, 1));
  conv2_ = register_module("conv2", torch::nn::Conv1d(o.d_ff, o.d_model, 1));
  norm1_ = register_module("norm1", torch::nn::LayerNorm(std::vector<int64_t>{o.d_model}));
  norm2_ = register_module("norm2", torch::nn::LayerNorm(std::vector<int64_t>{o.d_model}));
  dropout_ = register_module("dropout", torch::nn::Dropout(o.dropout));
}

torch::Tensor EncoderLayerImpl::forward(const torch::Tensor& input) {
  auto x = norm1_(input + dropout_(attention_(input, input, input)));
  return norm2_(x + feed_forward(x, conv1_, conv2_, dropout_));
}

ConvLayerImpl::ConvLayerImpl(int64_t channels) {
  down_conv_ = register_module("downConv", circular_conv(channels, channels));
  norm_ = register_module("norm", torch::nn::BatchNorm1d(channels));
}

torch::Tensor ConvLayerImpl::forward(const torch::Tensor& x) {
  auto y = torch::elu(norm_(down_conv_(x.permute({0, 2, 1}))));
  return F::max_pool1d(y, F::MaxPool1dFuncOptions(3).stride(2).padding(1)).transpose(1, 2);
}

DecoderLayerImpl::DecoderLayerImpl(const InformerOptions& o) {
  self_attention_ = register_module("self_attention", AttentionLayer(true, true, o, true));
  cross_attention_ = register_module("cross_attention", AttentionLayer(false, false, o, false));
  conv1_ = register_module("conv1", torch::nn::Conv1d(o.d_model, o.d_ff, 1));
  conv2_ = register_module("conv2", torch::nn::Conv1d(o.d_ff, o.d_model, 1));
  norm1_ = register_module("norm1", torch::nn::LayerNorm(std::vector<int64_t>{o.d_model}));
  norm2_ = register_module("norm2", torch::nn::LayerNorm(std::vector<int64_t>{o.d_model}));
  norm3_ = register_module("norm3", torch::nn::LayerNorm(std::vector<int64_t>{o.d_model}));
  dropout_ = register_module("dropout", torch::nn::Dropout(o.dropout));
}

torch::Tensor DecoderLayerImpl::forward(const torch::Tensor& input, const torch::Tensor& cross) {
  auto x = norm1_(input + dropout_(self_attention_(input, input, input)));
  x = norm2_(x + dropout_(cross_attention_(x, cross, cross)));
  return norm3_(x + feed_forward(x, conv1_, conv2_, dropout_));
}

DataEmbeddingImpl::DataEmbeddingImpl(int64_t c_in, int64_t d_model, double dropout)
    : d_model_(d_model) {
  auto value_embedding = register_module("value_embedding", std::make_shared<torch::nn::Module>());
  token_conv_ = value_embedding->register_module("tokenConv", circular_conv(c_in, d_model));
  torch::nn::init::kaiming_normal_(token_conv_->weight, 0.0, torch::kFanIn, torch::kLeakyReLU);
  dropout_ = register_module("dropout", torch::nn::Dropout(dropout));
}

torch::Tensor DataEmbeddingImpl::forward(const torch::Tensor& x, const torch::Tensor& marks) {
  const int64_t B = x.size(0), L = x.size(1);
  // One table serves both: FixedEmbedding's month (13), day (32), weekday (7) and hour (24)
  // tables are the first rows of the positional one.
  const auto& table = this->table(std::max<int64_t>(L, 32), x.options());
  const auto time = marks.to(torch::kLong);
  auto embed = [&](int64_t feature) {
    return table.index_select(0, time.select(2, feature).reshape(-1)).view({B, L, -1});
  };
  // hour, weekday, day, month: Informer's order of the sum
  const auto temporal = embed(3) + embed(2) + embed(1) + embed(0);
  auto value = token_conv_(x.permute({0, 2, 1})).transpose(1, 2);
  return dropout_(value + table.narrow(0, 0, L) + temporal);
}

const torch::Tensor& DataEmbeddingImpl::table(int64_t rows, const torch::TensorOptions& options) {
  if (!table_.defined() || table_.size(0) < rows || table_.device() != options.device()) {
    table_ = sinusoids(rows, d_model_, options);
  }
  return table_;
}

InformerImpl::InformerImpl(const InformerOptions& o) : options_(o) {
  for (auto [name, value] : {std::pair{"enc_in", o.enc_in},
                             {"dec_in", o.dec_in},
                             {"c_out", o.c_out},
                             {"seq_len", o.seq_len},
                             {"pred_len", o.pred_len},
                             {"factor", o.factor},
                             {"d_model", o.d_model},
                             {"n_heads", o.n_heads},
                             {"e_layers", o.e_layers},
                             {"d_layers", o.d_layers},
                             {"d_ff", o.d_ff}}) {
    if (value < 1) throw InputError(fmt::format("informer: {} is {}, expected >= 1", name, value));
  }
  if (o.d_model % 2 != 0 || o.d_model % o.n_heads != 0) {
    throw InputError(fmt::format("informer: d_model {} must be even and a multiple of n_heads {}",
                                 o.d_model, o.n_heads));
  }
  if (o.label_len < 0 || o.label_len > o.seq_len) {
    throw InputError(
        fmt::format("informer: label_len {} must be in [0, seq_len {}]", o.label_len, o.seq_len));
  }
  enc_embedding_ = register_module("enc_embedding", DataEmbedding(o.enc_in, o.d_model, o.dropout));
  dec_embedding_ = register_module("dec_embedding", DataEmbedding(o.dec_in, o.d_model, o.dropout));

  auto encoder = register_module("encoder", std::make_shared<torch::nn::Module>());
  attn_layers_ = encoder->register_module("attn_layers", torch::nn::ModuleList());
  conv_layers_ = encoder->register_module("conv_layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < o.e_layers; ++i) attn_layers_->push_back(EncoderLayer(o));
  for (int64_t i = 0; i + 1 < o.e_layers; ++i) conv_layers_->push_back(ConvLayer(o.d_model));
  encoder_norm_ =
      encoder->register_module("norm", torch::nn::LayerNorm(std::vector<int64_t>{o.d_model}));

  auto decoder = register_module("decoder", std::make_shared<torch::nn::Module>());
  decoder_layers_ = decoder->register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < o.d_layers; ++i) decoder_layers_->push_back(DecoderLayer(o));
  decoder_norm_ =
      decoder->register_module("norm", torch::nn::LayerNorm(std::vector<int64_t>{o.d_model}));
  projection_ = register_module("projection", torch::nn::Linear(o.d_model, o.c_out));
}

std::vector<std::shared_ptr<torch::nn::Module>> InformerImpl::layers() const {
  std::vector<std::shared_ptr<torch::nn::Module>> layers;
  for (size_t i = 0; i < attn_layers_->size(); ++i) {
    layers.push_back(attn_layers_->ptr(i));
    if (i < conv_layers_->size()) layers.push_back(conv_layers_->ptr(i));
  }
  for (const auto& layer : *decoder_layers_) layers.push_back(layer);
  return layers;
}

torch::Tensor InformerImpl::encode(const torch::Tensor& x_enc, const torch::Tensor& x_mark_enc) {
  auto x = enc_embedding_(x_enc, x_mark_enc);
  // Each layer but the last is followed by distilling, which halves the length.
  for (size_t i = 0; i < attn_layers_->size(); ++i) {
    x = nn::call(attn_layers_[i]->as<EncoderLayer>(), x);
    if (i < conv_layers_->size()) x = nn::call(conv_layers_[i]->as<ConvLayer>(), x);
  }
  return encoder_norm_(x);
}

torch::Tensor InformerImpl::forward(const torch::Tensor& x_enc, const torch::Tensor& x_mark_enc,
                                    const torch::Tensor& x_dec, const torch::Tensor& x_mark_dec) {
  auto memory = encode(x_enc, x_mark_enc);
  auto x = dec_embedding_(x_dec, x_mark_dec);
  for (const auto& layer : *decoder_layers_) x = nn::call(layer->as<DecoderLayer>(), x, memory);
  auto out = projection_(decoder_norm_(x));
  return out.narrow(1, out.size(1) - options_.pred_len, options_.pred_len);
}

}  // namespace ddp::models
