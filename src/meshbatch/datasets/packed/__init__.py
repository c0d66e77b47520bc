"""Packed examples of chat and supervised caches: ``PackedDataset``. This module only re-exports."""

from .packed_dataset import PackedBuild as PackedBuild
from .packed_dataset import PackedDataset as PackedDataset
from .packed_dataset import PackedDevice as PackedDevice
from .packed_dataset import PackedPlan as PackedPlan
from .packed_sources import PackedDataError as PackedDataError
from .packed_sources import open_examples as open_examples
