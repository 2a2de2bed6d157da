#!/usr/bin/python3
"""PyTorch's own DistributedDataParallel on gloo: Informer on a time-series CSV, as ddp_train runs it.

The model is zhouhaoyi/Informer2020's Informer (models/model.py, attn.py, encoder.py, decoder.py,
embed.py) with attn='prob', embed='fixed', activation='gelu', distil=True, mix=True and no
attention output, written out here with Informer2020's module names, so that its state dict and
ddp's C++ Informer load into each other with strict=True. One deliberate difference: the
sinusoidal tables (positional and fixed temporal embeddings) are computed in forward, not kept as
buffers or frozen parameters, so the state dict holds only trainable parameters and BatchNorm
buffers and DDP broadcasts nothing else.

The data are prepared as Informer2020's Dataset_Custom with timeenc=0 (as ddp's C++ reader does):
the date column dropped, the target moved last, a 70/10/20 split in time order whose later parts
start seq_len rows early, standard scaling fitted on the training rows, marks month, day,
weekday, hour, and sliding windows.

Start it as the ranks of a job with torchrun's env contract (RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT; world size 1 included). A DistributedSampler, a DataLoader with the per-rank batch,
DDP with its defaults, Adam, MSE. Rank 0 prints one JSON line per epoch with the global training
samples/s (all ranks' samples over the slowest rank's time) and the mean training loss over all
ranks' samples, as ddp_train's metrics; the last line adds the test split's MSE and MAE and those
of the naive forecast (the last known value repeated).
"""
import argparse
import csv
import datetime
import json
import math
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

# --- the model --------------------------------------------------------------------------------


def sinusoids(n, d_model, device=None):
    """Rows 0..n-1 of Informer2020's sinusoid table, computed in its order of float32 operations."""
    position = torch.arange(0, n, device=device).float().unsqueeze(1)
    div_term = (torch.arange(0, d_model, 2, device=device).float() * -(math.log(10000.0) / d_model)).exp()
    table = torch.zeros(n, d_model, device=device)
    table[:, 0::2] = torch.sin(position * div_term)
    table[:, 1::2] = torch.cos(position * div_term)
    return table


class TokenEmbedding(nn.Module):
    def __init__(self, c_in, d_model):
        super().__init__()
        self.tokenConv = nn.Conv1d(c_in, d_model, kernel_size=3, padding=1, padding_mode="circular")
        nn.init.kaiming_normal_(self.tokenConv.weight, mode="fan_in", nonlinearity="leaky_relu")

    def forward(self, x):
        return self.tokenConv(x.permute(0, 2, 1)).transpose(1, 2)


class PositionalEmbedding(nn.Module):
    def forward(self, x, table):
        return table[:x.size(1)].unsqueeze(0)


class TemporalEmbedding(nn.Module):
    # Informer2020's FixedEmbedding tables (hour 24, weekday 7, day 32, month 13 rows) are the
    # first rows of the sinusoid table, so one table serves all four.
    def forward(self, x_mark, table):
        x = x_mark.long()
        return table[x[:, :, 3]] + table[x[:, :, 2]] + table[x[:, :, 1]] + table[x[:, :, 0]]


class DataEmbedding(nn.Module):
    def __init__(self, c_in, d_model, dropout):
        super().__init__()
        self.d_model = d_model
        self.value_embedding = TokenEmbedding(c_in, d_model)
        self.position_embedding = PositionalEmbedding()
        self.temporal_embedding = TemporalEmbedding()
        self.dropout = nn.Dropout(p=dropout)

    def forward(self, x, x_mark):
        table = sinusoids(max(x.size(1), 32), self.d_model, x.device)
        x = self.value_embedding(x) + self.position_embedding(x, table) + self.temporal_embedding(x_mark, table)
        return self.dropout(x)


def triangular_causal_mask(B, L, device):
    return torch.triu(torch.ones([B, 1, L, L], dtype=torch.bool, device=device), diagonal=1)


def prob_mask(B, H, L, index, scores, device):
    mask = torch.ones(L, scores.shape[-1], dtype=torch.bool, device=device).triu(1)
    mask_ex = mask[None, None, :].expand(B, H, L, scores.shape[-1])
    indicator = mask_ex[torch.arange(B)[:, None, None], torch.arange(H)[None, :, None], index, :]
    return indicator.view(scores.shape)


class FullAttention(nn.Module):
    def __init__(self, mask_flag=True, factor=5, scale=None, attention_dropout=0.1):
        super().__init__()
        self.scale = scale
        self.mask_flag = mask_flag
        self.dropout = nn.Dropout(attention_dropout)

    def forward(self, queries, keys, values, attn_mask):
        B, L, H, E = queries.shape
        scale = self.scale or 1. / math.sqrt(E)
        scores = torch.einsum("blhe,bshe->bhls", queries, keys)
        if self.mask_flag:
            scores.masked_fill_(triangular_causal_mask(B, L, queries.device), -np.inf)
        A = self.dropout(torch.softmax(scale * scores, dim=-1))
        V = torch.einsum("bhls,bshd->blhd", A, values)
        return V.contiguous(), None


class ProbAttention(nn.Module):
    def __init__(self, mask_flag=True, factor=5, scale=None, attention_dropout=0.1):
        super().__init__()
        self.factor = factor
        self.scale = scale
        self.mask_flag = mask_flag
        self.dropout = nn.Dropout(attention_dropout)  # unused, as in Informer2020

    def _prob_QK(self, Q, K, sample_k, n_top):
        B, H, L_K, E = K.shape
        _, _, L_Q, _ = Q.shape
        # Each query's scores against sample_k keys drawn with replacement (on the CPU generator).
        K_expand = K.unsqueeze(-3).expand(B, H, L_Q, L_K, E)
        index_sample = torch.randint(L_K, (L_Q, sample_k))
        K_sample = K_expand[:, :, torch.arange(L_Q).unsqueeze(1), index_sample, :]
        Q_K_sample = torch.matmul(Q.unsqueeze(-2), K_sample.transpose(-2, -1)).squeeze(-2)
        # The n_top queries of largest sparsity measurement M, with their full scores.
        M = Q_K_sample.max(-1)[0] - torch.div(Q_K_sample.sum(-1), L_K)
        M_top = M.topk(n_top, sorted=False)[1]
        Q_reduce = Q[torch.arange(B)[:, None, None], torch.arange(H)[None, :, None], M_top, :]
        Q_K = torch.matmul(Q_reduce, K.transpose(-2, -1))
        return Q_K, M_top

    def _get_initial_context(self, V, L_Q):
        B, H, L_V, D = V.shape
        if not self.mask_flag:
            V_sum = V.mean(dim=-2)
            return V_sum.unsqueeze(-2).expand(B, H, L_Q, V_sum.shape[-1]).clone()
        assert L_Q == L_V  # masked: self-attention only
        return V.cumsum(dim=-2)

    def _update_context(self, context_in, V, scores, index, L_Q):
        B, H, L_V, D = V.shape
        if self.mask_flag:
            scores.masked_fill_(prob_mask(B, H, L_Q, index, scores, V.device), -np.inf)
        attn = torch.softmax(scores, dim=-1)
        context_in[torch.arange(B)[:, None, None], torch.arange(H)[None, :, None], index, :] = \
            torch.matmul(attn, V).type_as(context_in)
        return context_in

    def forward(self, queries, keys, values, attn_mask):
        B, L_Q, H, D = queries.shape
        _, L_K, _, _ = keys.shape
        queries = queries.transpose(2, 1)
        keys = keys.transpose(2, 1)
        values = values.transpose(2, 1)
        U_part = min(self.factor * int(np.ceil(np.log(L_K))), L_K)  # c*ln(L_K) sampled keys
        u = min(self.factor * int(np.ceil(np.log(L_Q))), L_Q)  # c*ln(L_Q) active queries
        scores_top, index = self._prob_QK(queries, keys, sample_k=U_part, n_top=u)
        scale = self.scale or 1. / math.sqrt(D)
        scores_top = scores_top * scale
        context = self._get_initial_context(values, L_Q)
        context = self._update_context(context, values, scores_top, index, L_Q)
        return context.transpose(2, 1).contiguous(), None


class AttentionLayer(nn.Module):
    def __init__(self, attention, d_model, n_heads, mix=False):
        super().__init__()
        d_keys = d_values = d_model // n_heads
        self.inner_attention = attention
        self.query_projection = nn.Linear(d_model, d_keys * n_heads)
        self.key_projection = nn.Linear(d_model, d_keys * n_heads)
        self.value_projection = nn.Linear(d_model, d_values * n_heads)
        self.out_projection = nn.Linear(d_values * n_heads, d_model)
        self.n_heads = n_heads
        self.mix = mix

    def forward(self, queries, keys, values, attn_mask):
        B, L, _ = queries.shape
        _, S, _ = keys.shape
        H = self.n_heads
        queries = self.query_projection(queries).view(B, L, H, -1)
        keys = self.key_projection(keys).view(B, S, H, -1)
        values = self.value_projection(values).view(B, S, H, -1)
        out, attn = self.inner_attention(queries, keys, values, attn_mask)
        if self.mix:
            # Informer2020's mix: [B, L, H, D] read as [B, H, L, D] before the heads are joined.
            out = out.transpose(2, 1).contiguous()
        out = out.view(B, L, -1)
        return self.out_projection(out), attn


class ConvLayer(nn.Module):
    def __init__(self, c_in):
        super().__init__()
        self.downConv = nn.Conv1d(c_in, c_in, kernel_size=3, padding=1, padding_mode="circular")
        self.norm = nn.BatchNorm1d(c_in)
        self.activation = nn.ELU()
        self.maxPool = nn.MaxPool1d(kernel_size=3, stride=2, padding=1)

    def forward(self, x):
        x = self.downConv(x.permute(0, 2, 1))
        x = self.maxPool(self.activation(self.norm(x)))
        return x.transpose(1, 2)


class EncoderLayer(nn.Module):
    def __init__(self, attention, d_model, d_ff, dropout):
        super().__init__()
        self.attention = attention
        self.conv1 = nn.Conv1d(d_model, d_ff, kernel_size=1)
        self.conv2 = nn.Conv1d(d_ff, d_model, kernel_size=1)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)
        self.activation = F.gelu

    def forward(self, x, attn_mask=None):
        new_x, attn = self.attention(x, x, x, attn_mask=attn_mask)
        x = x + self.dropout(new_x)
        y = x = self.norm1(x)
        y = self.dropout(self.activation(self.conv1(y.transpose(-1, 1))))
        y = self.dropout(self.conv2(y).transpose(-1, 1))
        return self.norm2(x + y), attn


class Encoder(nn.Module):
    def __init__(self, attn_layers, conv_layers, norm_layer):
        super().__init__()
        self.attn_layers = nn.ModuleList(attn_layers)
        self.conv_layers = nn.ModuleList(conv_layers)
        self.norm = norm_layer

    def forward(self, x, attn_mask=None):
        # Distilling: each conv layer halves the length (ceil(L/2)); the last attention layer has none.
        for attn_layer, conv_layer in zip(self.attn_layers, self.conv_layers):
            x, _ = attn_layer(x, attn_mask=attn_mask)
            x = conv_layer(x)
        x, _ = self.attn_layers[-1](x, attn_mask=attn_mask)
        return self.norm(x)


class DecoderLayer(nn.Module):
    def __init__(self, self_attention, cross_attention, d_model, d_ff, dropout):
        super().__init__()
        self.self_attention = self_attention
        self.cross_attention = cross_attention
        self.conv1 = nn.Conv1d(d_model, d_ff, kernel_size=1)
        self.conv2 = nn.Conv1d(d_ff, d_model, kernel_size=1)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.norm3 = nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)
        self.activation = F.gelu

    def forward(self, x, cross, x_mask=None, cross_mask=None):
        x = x + self.dropout(self.self_attention(x, x, x, attn_mask=x_mask)[0])
        x = self.norm1(x)
        x = x + self.dropout(self.cross_attention(x, cross, cross, attn_mask=cross_mask)[0])
        y = x = self.norm2(x)
        y = self.dropout(self.activation(self.conv1(y.transpose(-1, 1))))
        y = self.dropout(self.conv2(y).transpose(-1, 1))
        return self.norm3(x + y)


class Decoder(nn.Module):
    def __init__(self, layers, norm_layer):
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.norm = norm_layer

    def forward(self, x, cross, x_mask=None, cross_mask=None):
        for layer in self.layers:
            x = layer(x, cross, x_mask=x_mask, cross_mask=cross_mask)
        return self.norm(x)


class Informer(nn.Module):
    # Modules are registered in Informer2020's order, which is the state dict's key order.
    def __init__(self, enc_in, dec_in, c_out, seq_len, label_len, out_len, factor=5, d_model=512,
                 n_heads=8, e_layers=3, d_layers=2, d_ff=512, dropout=0.0):
        super().__init__()
        self.pred_len = out_len
        self.enc_embedding = DataEmbedding(enc_in, d_model, dropout)
        self.dec_embedding = DataEmbedding(dec_in, d_model, dropout)
        self.encoder = Encoder(
            [EncoderLayer(AttentionLayer(ProbAttention(False, factor, attention_dropout=dropout),
                                         d_model, n_heads, mix=False),
                          d_model, d_ff, dropout) for _ in range(e_layers)],
            [ConvLayer(d_model) for _ in range(e_layers - 1)],
            norm_layer=nn.LayerNorm(d_model))
        self.decoder = Decoder(
            [DecoderLayer(AttentionLayer(ProbAttention(True, factor, attention_dropout=dropout),
                                         d_model, n_heads, mix=True),
                          AttentionLayer(FullAttention(False, factor, attention_dropout=dropout),
                                         d_model, n_heads, mix=False),
                          d_model, d_ff, dropout) for _ in range(d_layers)],
            norm_layer=nn.LayerNorm(d_model))
        self.projection = nn.Linear(d_model, c_out, bias=True)

    def forward(self, x_enc, x_mark_enc, x_dec, x_mark_dec):
        enc_out = self.encoder(self.enc_embedding(x_enc, x_mark_enc))
        dec_out = self.decoder(self.dec_embedding(x_dec, x_mark_dec), enc_out)
        return self.projection(dec_out)[:, -self.pred_len:, :]


def make_informer(enc_in, dec_in, c_out, seq_len, label_len, pred_len, factor=5, d_model=64, n_heads=4,
                  e_layers=2, d_layers=1, d_ff=128, dropout=0.05):
    return Informer(enc_in, dec_in, c_out, seq_len, label_len, pred_len, factor=factor, d_model=d_model,
                    n_heads=n_heads, e_layers=e_layers, d_layers=d_layers, d_ff=d_ff, dropout=dropout)


# --- the data ---------------------------------------------------------------------------------


def time_marks(text):
    """month, day, weekday (Monday 0), hour of "YYYY-MM-DD[ HH:MM:SS]": Informer's timeenc=0."""
    t = datetime.datetime.fromisoformat(text.strip())
    return [t.month, t.day, t.weekday(), t.hour]


def load_series(path, seq_len, target="", features="M"):
    """Dataset_Custom's preparation: scaled values float32 [rows, cols], marks [rows, 4], and each
    split's rows [border1, border2)."""
    with open(path, newline="") as f:
        rows = [r for r in csv.reader(f) if r and any(c.strip() for c in r)]
    header, rows = [c.strip() for c in rows[0]], rows[1:]
    date = header.index("date") if "date" in header else -1
    target = header.index(target) if target else max(c for c in range(len(header)) if c != date)
    columns = [] if features == "S" else [c for c in range(len(header)) if c not in (date, target)]
    columns.append(target)
    values = np.array([[float(r[c]) for c in columns] for r in rows], dtype=np.float64)
    marks = np.array([time_marks(r[date]) if date >= 0 else [0] * 4 for r in rows], dtype=np.float32)
    n = len(rows)
    num_train, num_test = int(n * 0.7), int(n * 0.2)
    num_vali = n - num_train - num_test
    # Validation and test start seq_len rows early: their first encoder input is the history before.
    border1s = [0, num_train - seq_len, n - num_test - seq_len]
    border2s = [num_train, num_train + num_vali, n]
    # Informer's StandardScaler: population std of the training rows; the floor is ddp's reader's.
    mean = values[:num_train].mean(0)
    std = np.maximum(values[:num_train].std(0), 1e-12)
    scaled = ((values - mean) / std).astype(np.float32)
    return torch.from_numpy(scaled), torch.from_numpy(marks), dict(zip(["train", "val", "test"],
                                                                       zip(border1s, border2s)))


def windows(values, marks, border, seq_len, label_len, pred_len):
    """A split's windows as strided views [count, rows, cols]: x_enc, mark_enc, seq_y, mark_y."""
    v, m = values[border[0]:border[1]], marks[border[0]:border[1]]
    count = v.size(0) - seq_len - pred_len + 1
    y_begin, y_len = seq_len - label_len, label_len + pred_len

    def slide(t, start, length):
        return t[start:].unfold(0, length, 1)[:count].transpose(1, 2)
    return slide(v, 0, seq_len), slide(m, 0, seq_len), slide(v, y_begin, y_len), slide(m, y_begin, y_len)


def decoder_input(seq_y, label_len, pred_len):
    zeros = torch.zeros(seq_y.size(0), pred_len, seq_y.size(2), dtype=seq_y.dtype)
    return torch.cat([seq_y[:, :label_len], zeros], dim=1)


# --- the run ----------------------------------------------------------------------------------


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--optimizer", choices=["adam"], default="adam")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--seq-len", type=int, default=96)
    p.add_argument("--label-len", type=int, default=48)
    p.add_argument("--pred-len", type=int, default=24)
    p.add_argument("--features", choices=["M", "S", "MS"], default="M")
    p.add_argument("--target", default="")
    p.add_argument("--factor", type=int, default=5)
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--n-heads", type=int, default=4)
    p.add_argument("--e-layers", type=int, default=2)
    p.add_argument("--d-layers", type=int, default=1)
    p.add_argument("--d-ff", type=int, default=128)
    p.add_argument("--dropout", type=float, default=0.05)
    return p.parse_args()


def evaluate(model, split, a, f_dim):
    """Test MSE and MAE of the model and of the naive forecast, over all elements of all windows."""
    x, xm, y, ym = split
    sums = torch.zeros(4, dtype=torch.float64)
    count = 0
    model.eval()
    with torch.no_grad():
        for i in range(0, x.size(0), a.batch_size):
            bx, bxm, by, bym = (t[i:i + a.batch_size].contiguous() for t in (x, xm, y, ym))
            out = model(bx, bxm, decoder_input(by, a.label_len, a.pred_len), bym)
            target = by[:, -a.pred_len:, f_dim:]
            naive = bx[:, -1:, f_dim:].expand_as(target)
            sums += torch.stack([((out - target) ** 2).sum(), (out - target).abs().sum(),
                                 ((naive - target) ** 2).sum(), (naive - target).abs().sum()]).double()
            count += target.numel()
    return dict(zip(["test_mse", "test_mae", "naive_mse", "naive_mae"], (sums / count).tolist()))


def main():
    a = parse_args()
    torch.set_num_threads(a.threads)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    values, marks, borders = load_series(a.data, a.seq_len, a.target, a.features)
    f_dim = -1 if a.features == "MS" else 0
    dims = values.size(1)
    c_out = 1 if a.features == "MS" else dims
    train = windows(values, marks, borders["train"], a.seq_len, a.label_len, a.pred_len)
    test = windows(values, marks, borders["test"], a.seq_len, a.label_len, a.pred_len)
    torch.manual_seed(a.seed)
    model = DDP(make_informer(dims, dims, c_out, a.seq_len, a.label_len, a.pred_len, factor=a.factor,
                              d_model=a.d_model, n_heads=a.n_heads, e_layers=a.e_layers, d_layers=a.d_layers,
                              d_ff=a.d_ff, dropout=a.dropout))
    opt = torch.optim.Adam(model.parameters(), lr=a.lr)
    # The windows are views into the series; the DataLoader's collate copies one batch at a time.
    train_set = TensorDataset(*train)
    sampler = DistributedSampler(train_set, num_replicas=world, rank=rank, shuffle=True, seed=a.seed)
    loader = DataLoader(train_set, batch_size=a.batch_size, sampler=sampler)
    loss_fn = nn.MSELoss()
    for epoch in range(a.epochs):
        sampler.set_epoch(epoch)
        model.train()
        loss_sum = torch.zeros((), dtype=torch.float64)
        start = time.perf_counter()
        for x, xm, y, ym in loader:
            opt.zero_grad()
            out = model(x, xm, decoder_input(y, a.label_len, a.pred_len), ym)
            loss = loss_fn(out, y[:, -a.pred_len:, f_dim:])
            loss.backward()
            opt.step()
            loss_sum += loss.detach().double() * x.size(0)
        seconds = time.perf_counter() - start
        # Global figures, as ddp_train's: loss over all ranks' samples, time of the slowest rank.
        sums = torch.stack([loss_sum, torch.tensor(float(len(sampler)), dtype=torch.float64)])
        dist.all_reduce(sums)
        slowest = torch.tensor([seconds], dtype=torch.float64)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        line = {"epoch": epoch + 1, "samples_per_s": sums[1].item() / slowest.item(),
                "epoch_seconds": slowest.item(), "train_loss": sums[0].item() / sums[1].item()}
        if epoch + 1 == a.epochs:
            line.update(evaluate(model.module, test, a, f_dim))
        if rank == 0:
            print(json.dumps(line), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
