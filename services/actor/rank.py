"""A non-zero rank of the actor service: join the group, follow rank 0 until it says stop."""

import sys

import torch.distributed as dist

from meshrl.lifeline import die_with_parent
from services.actor.comm import follow
from services.actor.handler import RankHandler
from services.actor.launch import join_group


def main(role: str) -> int:
    die_with_parent()  # a rank outlives neither rank 0 nor, through it, the orchestrator
    join_group()
    follow(RankHandler(role))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
