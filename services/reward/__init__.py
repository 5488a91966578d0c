"""Reward service: rule-based scorers, user functions, reward models, remote scorers.

Not built yet: the reward issue builds it on top of meshrl.rpc and the RewardService proto.
"""
