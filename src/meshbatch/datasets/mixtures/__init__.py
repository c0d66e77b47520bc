"""Mixtures of several datasets: Levanter's stable mixture and the token-balanced interleave."""

from .composite import Composite as Composite
from .composite import child_keys as child_keys
from .composite import derive_keys as derive_keys
from .mixture_schedule import Mixture as Mixture
from .mixture_schedule import mixture_schedule as mixture_schedule
from .positions import PositionLog as PositionLog
from .positions import positions as positions
from .token_balanced import BalancedState as BalancedState
from .token_balanced import CountOverflowError as CountOverflowError
from .token_balanced import TokenBalancedMixture as TokenBalancedMixture
