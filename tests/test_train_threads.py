"""CPU runs compute on the cores that are idle when they start: torch's OpenMP threads spin while they wait for
one another, so on cores that other processes keep busy a step took several times longer than on one thread."""

from __future__ import annotations

import os

import pytest
import torch

from gptforge.train import cpu_threads


@pytest.fixture
def threads_restored():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("cores,load,threads", [(2, 5.3, 1), (2, 0.1, 2), (16, 0.0, 16), (4, 1.6, 2), (8, 7.4, 1)])
def test_the_idle_cores(cores, load, threads):
    assert cpu_threads.idle_cores(cores, load) == threads


def test_a_cpu_run_takes_the_idle_cores(monkeypatch, threads_restored):
    cores = len(os.sched_getaffinity(0))
    monkeypatch.setattr(cpu_threads.os, "getloadavg", lambda: (float(cores), 0.0, 0.0))  # every core busy
    note = cpu_threads.use_idle_cores(torch.device("cpu"), env={})
    assert torch.get_num_threads() == 1
    assert note.code == "cpu-threads" and f"1 of {cores}" in note.message


def test_the_users_setting_wins(monkeypatch, threads_restored):
    torch.set_num_threads(1)
    monkeypatch.setattr(cpu_threads.os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    note = cpu_threads.use_idle_cores(torch.device("cpu"), env={"OMP_NUM_THREADS": "1"})
    assert torch.get_num_threads() == 1 and note.code == "cpu-threads" and "(OMP_NUM_THREADS)" in note.message


def test_a_gpu_run_is_left_alone(threads_restored):
    before = torch.get_num_threads()
    assert cpu_threads.use_idle_cores(torch.device("cuda", 0), env={}) is None
    assert torch.get_num_threads() == before
