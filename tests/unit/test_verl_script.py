"""orchestrator/verl_script.py (over orchestrator/shell.py): a launch script's verl settings as the shell
gives them (word splitting, quoting, arrays, parameter expansions, if/case, functions), or a one-line
refusal naming what only running the script would tell, never a guess."""

import pytest

from orchestrator.from_verl import convert, read
from orchestrator.shell import Shell
from orchestrator.verl_script import read_script

RUN = "python3 -m verl.trainer.main_ppo"


def settings(script: str) -> dict[str, object]:
    overrides, unread, _ = read_script(script)
    assert not unread, unread
    return overrides


def refusal(script: str) -> str:
    with pytest.raises(ValueError) as e:
        convert(*read(script))
    assert "\n" not in str(e.value)
    return str(e.value)


def test_unquoted_expansions_split_into_words_and_quoted_ones_do_not():
    script = f"""
loss_mode=sapo
ACTOR="
    a.lr=1e-6 \\
    a.loss=${{loss_mode}}
    a.n=$((4 * 4))"
QUOTED="b.x=1 b.y=2"
EMPTY=""
{RUN} $ACTOR "$QUOTED" $EMPTY c.z='one two' c.w="$EMPTY"
"""
    assert settings(script) == {
        "a.lr": 1e-6,
        "a.loss": "sapo",
        "a.n": 16,
        "b.x": "1 b.y=2",
        "c.z": "one two",
        "c.w": "",
    }


def test_arrays_and_parameter_expansions():
    script = f"""
ARGS=(
    a.n=${{N:-5}}  # a comment inside the array
    "a.name=two words"
)
ARGS+=(a.m=${{M:=3}} a.copy=$M)
NONE=()
X=${{UNSET:+never}}
P=path/to/actor
{RUN} "${{ARGS[@]}}" "${{NONE[@]}}" a.len=${{#ARGS[@]}} a.first=${{ARGS[0]}} \\
    a.sub=${{P//\\//.}} a.base=${{P##*/}} a.dir=${{P%/*}} a.x=$X a.up=${{P^^}} "$@"
"""
    overrides, unread, assumed = read_script(script)
    assert overrides == {
        "a.n": 5,
        "a.name": "two words",
        "a.m": 3,
        "a.copy": 3,
        "a.len": 4,
        "a.first": "a.n=5",
        "a.sub": "path.to.actor",
        "a.base": "actor",
        "a.dir": "path/to",
        "a.x": "",
        "a.up": "PATH/TO/ACTOR",
    }
    assert assumed == [
        "its own defaults, as if the environment set none of: N, M, UNSET",
        "read as run with no arguments: $@, $1, ... are empty",
    ]


def test_branches_on_known_values_are_taken_as_the_shell_takes_them():
    script = f"""
backend=${{BACKEND:-fsdp}}
n=2
if [[ $backend == "megatron" ]]; then
    n=4
elif [ "$backend" = fsdp ] && [ $n -gt 1 ]; then
    n=8
else
    n=16
fi
case "$backend" in
    meg*) mode=a ;;
    fsdp | fsdp2) mode=b ;;
esac
(( n % 3 == 2 )) && odd=yes || odd=no
[ -z "${{UNSET_TOO:-}}" ] && extra=set
set_it() {{ from_function=$1; }}
set_it called
cat > notes.txt << EOF
{RUN} not.this=1
EOF
{RUN} a.n=$n a.mode=$mode a.odd=$odd a.extra=$extra a.f=$from_function
"""
    assert settings(script) == {"a.n": 8, "a.mode": "b", "a.odd": "yes", "a.extra": "set", "a.f": "called"}


def test_what_needs_running_refuses_where_it_decides_a_training_setting():
    detect = "DEVICE=${DEVICE:-$(python3 -c 'import torch_npu' && echo npu || echo gpu)}\n"
    # a command's output decides the batch through a case: refused, naming the variable and its line
    why = refusal(
        detect + f'case "$DEVICE" in\n  npu) bsz=16 ;;\n  *) bsz=1024 ;;\nesac\n{RUN} data.train_batch_size=$bsz'
    )
    assert why.startswith('data.train_batch_size=$bsz needs the shell (bsz, set under `case "$DEVICE" in` (line 2)')
    assert "which depends on DEVICE (line 1: `$(python3 -c 'import torch_npu'" in why
    # an unquoted unknown, or an array changed under such a branch: which settings it gives is not known
    assert "which verl settings `$EXTRA_ARGS` gives needs $EXTRA_ARGS, the environment's" in refusal(
        f"{RUN} a.n=1 $EXTRA_ARGS"
    )
    why = refusal(detect + f'X=()\nif [ "$DEVICE" = npu ]; then X+=(a.n=2); fi\n{RUN} "${{X[@]}}"')
    assert why.startswith('line 4: which verl settings `${X[@]}` gives needs X, set under `if [ "$DEVICE" = npu ]')
    assert "its verl command runs only under `if [ -d /data ]; then` (line 1)" in refusal(
        f"if [ -d /data ]; then\n  {RUN} a.n=1\nfi"
    )
    assert "the script ends (`exit 1`) before its verl command" in refusal(f"exit 1\n{RUN} a.n=1")
    assert "rollout.n=$((n + 1)) needs the shell (n=abc, not an integer)" in refusal(
        f"n=abc\n{RUN} actor_rollout_ref.rollout.n=$((n + 1))"
    )
    assert "(`$((n > 2 ? 8 : 4))`, not read here)" in refusal(
        f"n=1\n{RUN} actor_rollout_ref.rollout.n=$((n > 2 ? 8 : 4))"
    )
    assert "rollout.n=$(nproc) needs the shell (`$(nproc)`, a command's output)" in refusal(
        f"{RUN} actor_rollout_ref.rollout.n=$(nproc)"
    )


def test_what_needs_running_is_left_out_named_where_it_is_a_path_or_placement():
    script = f"""
NODES=$(scontrol show hostnames | wc -l)
if [ -n "$SLURM_JOB_ID" ]; then echo on slurm; fi
{RUN} actor_rollout_ref.rollout.n=4 trainer.nnodes=$NODES data.train_files=$HOME/train.parquet \\
    actor_rollout_ref.actor.fsdp_config.fsdp_size=$(nproc)
"""
    c = convert(*read(script))
    assert c.config["rollout"]["n"] == 4
    why = {key: reason for key, _, reason in c.left}
    assert why["data.train_files"] == "needs the shell ($HOME, the environment's: the script does not set it)"
    assert why["trainer.nnodes"] == "verl's placement and naming: not a setting here"
    assert why["actor_rollout_ref.actor.fsdp_config.fsdp_size"].startswith("needs the shell (`$(nproc)`")


def test_a_script_the_reader_cannot_parse_is_refused_with_its_line():
    with pytest.raises(ValueError, match="line 2: an unclosed '"):
        read_script(f"{RUN} \\\n  a.n='1")
    with pytest.raises(ValueError, match=r"line 2: the script stops without MODEL: set MODEL"):
        read_script(f'MODEL=${{MODEL:-}}\n: "${{MODEL:?set MODEL}}"\n{RUN} a.n=1')


def test_locals_end_with_their_function_and_arithmetic_assignments_are_not_guessed():
    script = f"""
n=4
scale() {{ local n=$1; doubled=$((n * 2)); }}
scale 8
(( steps++ ))
let "epochs = 3"
{RUN} a.n=$n a.doubled=$doubled a.steps=$steps a.epochs=$epochs
"""
    overrides, unread, _ = read_script(script)
    assert overrides == {"a.n": 4, "a.doubled": 16}  # the global n again after the call
    assert unread["a.steps"][1] == "needs the shell (steps, set by `((steps++))` (line 5), not read here)"
    assert unread["a.epochs"][1] == 'needs the shell (epochs, set by `let "epochs = 3"` (line 6))'


def test_the_shell_reader_knows_nothing_of_verl():
    """orchestrator/shell.py runs a script up to any command it is told to seek; verl_script.py gives it
    verl's entry points and reads the Hydra words after them."""
    shell = Shell({"train.py"}, "its training command")
    reached = shell.reach('STEPS=${STEPS:-10}\nARGS=(--lr 1e-3)\ntorchrun train.py --steps $STEPS "${ARGS[@]}"\n')
    assert reached is not None and reached[1] == 3  # the line of the command
    assert [f.text for f in reached[0]] == ["--steps", "10", "--lr", "1e-3"]
    assert shell.taken() == ["its own defaults, as if the environment set none of: STEPS"]
    assert Shell({"train.py"}, "its training command").reach("echo no such command\n") is None
    with pytest.raises(ValueError, match="line 1: the script ends .* before its training command"):
        Shell({"train.py"}, "its training command").reach("exit 1\ntorchrun train.py\n")
