"""The models' hyper-parameters, without TensorFlow: a command line can check its flags (and print
its --help) before TensorFlow loads, which takes seconds.

`GNMTHParams` (``gnmt_v2`` and ``gnmt``), `InceptionV3HParams` and `TransformerHParams`; each
refuses a bad value with a `ConfigError` that names the field and the fix.
"""

from __future__ import annotations

import dataclasses
import math

from baechi_tf.errors import ConfigError

__all__ = ["GNMTHParams", "InceptionV3HParams", "TransformerHParams"]

_UNIT_TYPES = ("lstm", "gru")
_MIN_IMAGE_SIZE = 75


@dataclasses.dataclass(frozen=True)
class GNMTHParams:
    """GNMT hyper-parameters; the defaults are the original README's setting."""

    batch_size: int = 128  # sentences per step (B)
    vocab_size: int = 30000  # source and target vocabulary (V)
    max_seq_length: int = 40  # source and target length, = unrolled steps (T)
    rnn_units: int = 512  # hidden and embedding size (U)
    num_layers: int = 4  # encoder layers (1 bidirectional + L-1) = decoder layers (L)
    rnn_unit_type: str = "lstm"  # 'lstm' or 'gru'
    encoder_type: str = "gnmt"  # GNMT needs the 'gnmt' encoder, as in the original
    residual: bool = True  # residual connections on the upper layers
    num_gpus: int = 4  # devices of the expert layout's round-robin (G)
    colocation: bool = True  # per-(layer, step) colocation groups
    use_new_attention: bool = True  # True: gnmt_v2; False: gnmt (v1 attention)
    forget_bias: float = 1.0  # added to the LSTM forget gate
    seed: int = 1  # graph seed (initial values) and seed of the synthetic tokens

    def __post_init__(self) -> None:
        for field in ("batch_size", "vocab_size", "max_seq_length", "rnn_units", "num_gpus"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"GNMT {field}={value!r}; give a positive integer")
        layers = self.num_layers
        if isinstance(layers, bool) or not isinstance(layers, int) or layers < 2:
            raise ConfigError(
                f"GNMT num_layers={self.num_layers!r}; the GNMT encoder has one bidirectional "
                "layer and at least one unidirectional layer: give --num_layers >= 2"
            )
        if self.rnn_unit_type not in _UNIT_TYPES:
            raise ConfigError(
                f"rnn_unit_type={self.rnn_unit_type!r}; use one of {', '.join(_UNIT_TYPES)}"
            )
        if self.encoder_type != "gnmt":
            raise ConfigError(
                f"encoder_type={self.encoder_type!r}: GNMT supports only --encoder_type=gnmt "
                "(one bidirectional layer, then unidirectional ones), as in the original"
            )


@dataclasses.dataclass(frozen=True)
class InceptionV3HParams:
    """Inception-v3 hyper-parameters; the defaults are the original's (batch 32, 299x299)."""

    batch_size: int = 32  # images per step
    image_size: int = 299  # height = width of the input images, >= 75
    num_classes: int = 1000  # logits per image
    data_format: str = "NHWC"  # 'NHWC' or 'NCHW'
    depth_multiplier: float = 1.0  # scales every convolution's depth (slim's depth_multiplier)
    min_depth: int = 16  # lower bound of a scaled depth
    is_training: bool = True  # batch norm on batch statistics with moving-average updates, dropout
    batch_norm_decay: float = 0.9997  # moving-average decay
    batch_norm_epsilon: float = 0.001  # added to the variance
    dropout_keep_prob: float = 0.8  # before the logits, when training
    seed: int = 1  # graph seed (initial values, dropout) and seed of the synthetic images

    def __post_init__(self) -> None:
        for field in ("batch_size", "num_classes", "min_depth"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"Inception-v3 {field}={value!r}; give a positive integer")
        if not isinstance(self.image_size, int) or self.image_size < _MIN_IMAGE_SIZE:
            raise ConfigError(
                f"Inception-v3 image_size={self.image_size!r}; it must be at least "
                f"{_MIN_IMAGE_SIZE} pixels"
            )
        if self.data_format not in ("NHWC", "NCHW"):
            raise ConfigError(f"data_format={self.data_format!r}; use NHWC or NCHW")
        if not (isinstance(self.depth_multiplier, (int, float))
                and math.isfinite(self.depth_multiplier) and self.depth_multiplier > 0):
            raise ConfigError(
                f"depth_multiplier={self.depth_multiplier!r}; it must be a finite number > 0")
        if not 0 < self.dropout_keep_prob <= 1:
            raise ConfigError(f"dropout_keep_prob={self.dropout_keep_prob!r}; give 0 < p <= 1")


@dataclasses.dataclass(frozen=True)
class TransformerHParams:
    """Transformer hyper-parameters; the defaults are the paper's base model, B=128, T=40."""

    batch_size: int = 128  # sentences per step (B)
    vocab_size: int = 32000  # source and target vocabulary (V)
    max_seq_length: int = 40  # source and target length (T)
    num_layers: int = 6  # encoder layers = decoder layers (L)
    num_heads: int = 8  # attention heads; must divide d_model
    d_model: int = 512  # width of every sub-layer's input and output
    d_ff: int = 2048  # inner width of the feed-forward layers
    dropout: float = 0.1  # after each sub-layer, on the attention weights and embeddings
    num_gpus: int = 4  # devices of the expert layout's round-robin (G)
    seed: int = 1  # graph seed (initial values, dropout) and seed of the synthetic tokens

    def __post_init__(self) -> None:
        for field in ("batch_size", "vocab_size", "max_seq_length", "num_layers", "num_heads",
                      "d_model", "d_ff", "num_gpus"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"Transformer {field}={value!r}; give a positive integer")
        if self.d_model % self.num_heads:
            raise ConfigError(
                f"Transformer d_model={self.d_model} is not a multiple of "
                f"num_heads={self.num_heads}"
            )
        if not 0 <= self.dropout < 1:
            raise ConfigError(f"Transformer dropout={self.dropout!r}; give 0 <= p < 1")
