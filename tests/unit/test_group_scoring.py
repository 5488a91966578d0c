"""An agent's group scoring as a step applies it (orchestrator/agents/scores.score_groups), around a
runner that answers as the agent pool does (orchestrator/agents/pool.py; its real workers are
tests/unit/test_agent_pool.py's): the group's scores replace its episodes' own, None leaves them, and a
group that cannot be scored is lost whole, never scored 0 in part."""

from meshrl.trajectory import Trajectory
from orchestrator.agents.scores import Played, score_groups


class Runner:
    """score_group's answers by group, as the pool returns them: (answer, "") or (None, why)."""

    def __init__(self, answers: dict):
        self.answers, self.asked = answers, []

    def score_group(self, group, keys, tasks, results):
        self.asked.append((group, keys, results))
        return self.answers[group]


def played(n: int, lost: tuple[int, ...] = ()) -> list[Played]:
    out = []
    for i in range(n):
        t = Trajectory([1, 2])
        t.task, t.env_reward, t.error = {"i": i}, 0.5, "the agent raised X" if i in lost else ""
        out.append(Played(t, 1, 1, f"k{i}", None if i in lost else {"reward": 0.5}))
    return out


def test_each_group_is_scored_together_and_what_it_cannot_score_is_lost_whole():
    runner = Runner(
        {
            0: ([{"reward": 1.0, "acc": True}, 0.25], ""),  # scores in the group's order
            1: (None, ""),  # the episodes' own stand
            2: (None, "the agent raised RuntimeError: no"),  # the group is lost
            3: ([1.0], ""),  # one score for two episodes: lost too
        }
    )
    episodes = played(8)
    score_groups(runner, episodes, 2, needs_reward=True)
    rewards = [(p.traj.env_reward, p.traj.error) for p in episodes]
    assert rewards[:4] == [(1.0, ""), (0.25, ""), (0.5, ""), (0.5, "")]
    assert episodes[0].traj.info == {"acc": True}
    assert all(r == 0.0 and "its group could not be scored" in e for r, e in rewards[4:])
    assert [a[1] for a in runner.asked] == [["k0", "k1"], ["k2", "k3"], ["k4", "k5"], ["k6", "k7"]]


def test_a_lost_episode_stays_lost_and_its_group_scores_the_rest():
    runner = Runner({0: ([None, {"reward": 1.0}, "not a number"], "")})
    episodes = played(3, lost=(0,))
    score_groups(runner, episodes, 3, needs_reward=True)
    assert runner.asked[0][2] == [None, {"reward": 0.5}, {"reward": 0.5}]  # the lost one is None to it
    assert episodes[0].traj.error == "the agent raised X"
    assert (episodes[1].traj.env_reward, episodes[1].traj.error) == (1.0, "")
    assert "must be a number" in episodes[2].traj.error  # a score that is no reward loses its episode
