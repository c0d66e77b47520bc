"""Levanter ``AsyncDataset``s built by meshbatch kernels, for Levanter's ``DataLoader``.

``MeshbatchDataset`` fronts any meshbatch dataset (``CausalLMDataset`` over a cache with our
shuffles and coalesced reads, splice datasets, stable mixtures): ``get_batch(indices)`` plans,
reads and builds all requested rows with the dataset's own plan and build kernels (the rows the
``Pipeline`` would make for the same stream positions) and hands the ``DataLoader`` the
``LmExample``s it stacks. The in-memory splice classes are thin fronts over ``SpliceDataset``:

    dataset = MultiSpliceDocumentDataset(Pos=Pos, doc_tokens_list=docs, pad_token_id=0,
                                         content_start_mode="coverage_balanced", alpha=0.8)
    loader = DataLoader(dataset, batch_size, mesh=mesh, axis_resources={"batch": "data"})

Meshes: ``train_lm`` builds its datasets inside the ``Trainer`` (the trainer's mesh is the
context mesh) and passes a key made there, but the ``DataLoader`` reads inside Levanter's
``local_cpu_mesh()``. An array made under one cannot enter jitted code under the other (jax >=
0.9: Explicit vs Auto axis types; any jax: several devices vs one CPU), so every array this
module makes, and every kernel call, lives in ``local_cpu_mesh()``; the incoming key is remade
there from its host bits.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

import haliax as hax
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import PRNGKeyArray
from levanter.data.dataset import AsyncDataset
from levanter.layers.attention import AttentionMask
from levanter.models.lm_model import LmExample
from levanter.utils.jax_utils import local_cpu_mesh

from meshbatch.arguments import as_key, check_bool, check_optional_int
from meshbatch.datasets.protocol import Content, Dataset, Rows
from meshbatch.datasets.splice.indexed import SpliceDataset, split_indices
from meshbatch.kernels import Batch
from meshbatch.pipeline.fetch import fetch_rows
from meshbatch.pipeline.programs import build_program_single, plan_program
from meshbatch.shuffles.shuffle_spec import block_shuffle

T = TypeVar("T")


def loader_key(key: PRNGKeyArray | int) -> PRNGKeyArray:
    """``key`` (typed, raw ``uint32[2]`` or an int seed, checked by the one key normaliser
    ``as_key``) remade from its host bits inside ``local_cpu_mesh()``, where ``DataLoader`` reads
    (see the module docstring); a raw key stays raw."""
    raw = isinstance(key, jax.Array | np.ndarray) and not jnp.issubdtype(key.dtype, jax.dtypes.prng_key)
    bits = np.asarray(jax.random.key_data(as_key(key)))  # read where the key was made
    with local_cpu_mesh():
        return jnp.asarray(bits) if raw else jax.random.wrap_key_data(bits)


def loader_epochs(epochs: int | None) -> int | None:
    """``train_lm``'s ``epochs`` (``TrainLmConfig.epoch``, 0 by default) as a dataset length:
    ``None`` or 0 streams every epoch (each reshuffled as the dataset's spec says, ``is_finite()``
    false); ``n > 0`` ends after ``n`` epochs, as Levanter's ``EpochDataset``."""
    epochs = check_optional_int("epochs", epochs, low=0)
    return epochs or None


def lm_examples(batch: Batch, Pos: hax.Axis) -> list[LmExample]:
    """One Levanter ``LmExample`` per row of ``batch`` (segment ids as an attention mask)."""
    if batch.tokens.shape[1] != Pos.size:
        raise ValueError(f"batch rows have {batch.tokens.shape[1]} tokens, Pos.size={Pos.size}")
    tokens, loss_mask, segments = (np.asarray(x) for x in (batch.tokens, batch.loss_mask, batch.segment_ids))
    out = []
    for row in range(tokens.shape[0]):
        segment_ids = hax.named(jnp.asarray(segments[row]), Pos)
        out.append(
            LmExample(
                tokens=hax.named(jnp.asarray(tokens[row]), Pos),
                loss_mask=hax.named(jnp.asarray(loss_mask[row]), Pos),
                attn_mask=AttentionMask.causal().with_segment_ids(segment_ids),
            )
        )
    return out


class _Epochs(AsyncDataset[T]):
    """Shared length logic: ``num_examples`` rows per epoch, ``epochs`` of them or endless."""

    epochs: int | None
    num_examples: int

    async def async_len(self) -> int:
        if self.epochs is None:
            raise ValueError(f"{type(self).__name__} streams every epoch (epochs=None): it has no length")
        return self.num_examples * self.epochs

    async def final_length_is_known(self) -> bool:
        return self.epochs is not None

    def is_finite(self) -> bool:
        return self.epochs is not None

    async def current_len(self) -> int | None:
        return None if self.epochs is None else await self.async_len()


class MeshbatchDataset(_Epochs[LmExample]):
    """A meshbatch ``Dataset`` as a Levanter ``AsyncDataset[LmExample]``.

    Index ``g`` is stream position ``g mod num_examples`` of epoch ``g // num_examples``, exactly
    the row ``Pipeline`` makes at that stream position with the same key.

    ``fast_path``: inside ``meshbatch.levanter.fast_path()`` (the entry point),
    ``Trainer.data_loader`` feeds it through ``Pipeline`` (``PipelineLoader``) instead of
    Levanter's ``DataLoader``; the batches are the same. A dataset that carries state (a
    ``TokenBalancedMixture``) or whose cache is still being written (quick start) trains only
    there (refused with ``fast_path=False``): its rows exist in step order. ``epochs``: see
    ``loader_epochs``.
    """

    def __init__(
        self,
        dataset: Dataset,
        *,
        Pos: hax.Axis,
        key: PRNGKeyArray | int,
        epochs: int | None = None,
        fast_path: bool = True,
    ):
        super().__init__()
        self.fast_path = check_bool("fast_path", fast_path)
        if not isinstance(dataset, Dataset):
            raise TypeError(f"dataset must be a meshbatch Dataset (got {type(dataset).__name__})")
        if dataset.seq_len != Pos.size:
            raise ValueError(f"Pos.size={Pos.size} must equal the dataset's seq_len={dataset.seq_len}")
        # Rows by index need every earlier step (stateful) or a final length (growing).
        self.stateful = dataset.init_state() is not None
        self.growing = not dataset.length_is_final
        if (self.stateful or self.growing) and not fast_path:
            why = "carries state from step to step" if self.stateful else "is still being written"
            raise ValueError(
                f"{dataset!r} {why}: it trains on the fast path only (fast_path=True, inside "
                "meshbatch.levanter.fast_path()) or through meshbatch.Pipeline"
            )
        self.dataset, self.Pos = dataset, Pos
        self.epochs = loader_epochs(epochs)
        self.key = loader_key(key)
        with local_cpu_mesh():
            self.device, self.host = dataset.make(self.key)  # the dataset's two halves for the key
        self.num_examples = self.host.num_examples

    def batch(self, indices: Sequence[int] | np.ndarray) -> Batch:
        """The meshbatch ``Batch`` of global indices (what ``get_batch`` turns into examples)."""
        if self.stateful or self.growing:
            raise ValueError(
                f"{self.dataset!r} is stateful or still being written: its rows exist only in step "
                "order, through the fast path (PipelineLoader) or meshbatch.Pipeline, not by index"
            )
        epoch, position = split_indices(indices, self.num_examples)
        with local_cpu_mesh():
            rows = Rows(jnp.asarray(position, jnp.uint32), jnp.asarray(epoch, jnp.uint32))
            plan, _ = plan_program(self.device, rows, None)
            content = None
            if self.host.fetches:
                tokens, offsets = fetch_rows(self.host, self.host.spans(jax.tree.map(np.asarray, plan)))
                content = Content(jnp.asarray(tokens), jnp.asarray(offsets))
            return build_program_single(self.device, plan, content)

    async def get_batch(self, indices: Sequence[int]) -> Sequence[LmExample]:
        if len(indices) == 0:
            return []
        batch = self.batch(np.asarray(indices, dtype=np.int64))
        with local_cpu_mesh():
            return lm_examples(batch, self.Pos)


class MultiSpliceDocumentDataset(_Epochs[LmExample]):
    """The multi-document splice dataset over in-memory documents (every ``SpliceSpec`` field by
    keyword, and ``key``; ``Pos.size`` is the frame length); for documents in a cache,
    ``MeshbatchDataset(SpliceLMDataset(...))``. ``epochs``: see ``loader_epochs``.
    """

    def __init__(
        self,
        *,
        Pos: hax.Axis,
        doc_tokens_list: Sequence[np.ndarray],
        pad_token_id: int,
        epochs: int | None = 1,
        **spec,
    ):
        super().__init__()
        self.Pos, self.epochs = Pos, loader_epochs(epochs)
        if spec.get("key") is not None:
            spec["key"] = loader_key(spec["key"])
        with local_cpu_mesh():
            self.splice = SpliceDataset(doc_tokens_list, seq_len=Pos.size, pad_token_id=pad_token_id, **spec)
        self.num_examples = len(self.splice)

    async def get_batch(self, indices: Sequence[int]) -> Sequence[LmExample]:
        with local_cpu_mesh():
            return lm_examples(self.splice.get_batch(np.asarray(indices, dtype=np.int64)), self.Pos)


class SpliceDocumentDataset(MultiSpliceDocumentDataset):
    """The single-document splice dataset: ``MultiSpliceDocumentDataset`` of one document."""

    def __init__(self, *, Pos: hax.Axis, doc_tokens: np.ndarray, pad_token_id: int, **spec):
        super().__init__(Pos=Pos, doc_tokens_list=[doc_tokens], pad_token_id=pad_token_id, **spec)


class BlockShufflingDataset(AsyncDataset[T]):
    """marin's ``BlockShufflingDataset``: the same order (``compat="levanter"``, the default), or
    the strong default with ``compat=None``; every batch's indices mapped in one jitted call.
    """

    def __init__(
        self,
        dataset: AsyncDataset[T],
        io_block_size: int,
        *,
        window_blocks: int,
        key: PRNGKeyArray | int,
        perm_type: str = "feistel",
        compat: str | None = "levanter",
    ):
        super().__init__()
        if not dataset.is_finite():
            raise ValueError("BlockShufflingDataset only supports finite datasets")
        self.dataset = dataset
        self.key = loader_key(key)
        self.io_block_size, self.window_blocks = io_block_size, window_blocks
        self.perm_type, self.compat = perm_type, compat
        self._shuffle = None

    async def _get_shuffle(self):
        if self._shuffle is None:
            length = await self.dataset.async_len()
            with local_cpu_mesh():
                self._shuffle = block_shuffle(
                    length,
                    io_block_size=self.io_block_size,
                    window_blocks=self.window_blocks,
                    key=self.key,
                    kind=self.perm_type,
                    compat=self.compat,
                )
        return self._shuffle

    async def async_len(self) -> int:
        return await self.dataset.async_len()

    async def final_length_is_known(self) -> bool:
        return await self.dataset.final_length_is_known()

    def is_finite(self) -> bool:
        return True

    async def current_len(self) -> int | None:
        return await self.dataset.current_len()

    async def get_batch(self, indices: Sequence[int]) -> Sequence[T]:
        if len(indices) == 0:
            return []
        shuffle = await self._get_shuffle()
        with local_cpu_mesh():
            mapped = np.asarray(shuffle(np.asarray(indices, dtype=np.int64)))
        return await self.dataset.get_batch([int(i) for i in mapped])
