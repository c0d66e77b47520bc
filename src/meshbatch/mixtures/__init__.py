"""Mixtures of several datasets: Levanter's stable mixture and the token-balanced interleave."""

from .schedule import mixture_schedule as mixture_schedule
