"""Mixtures of several datasets: Levanter's stable mixture and the token-balanced interleave."""

from .balanced import BalancedState as BalancedState
from .balanced import TokenBalancedMixture as TokenBalancedMixture
from .composite import Composite as Composite
from .composite import derive_keys as derive_keys
from .positions import PositionLog as PositionLog
from .positions import positions as positions
from .schedule import mixture_schedule as mixture_schedule
from .stable import Mixture as Mixture
