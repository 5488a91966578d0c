"""Actor service: trainable (actor, critic) and frozen (ref) models on an FSDP group.

Not built yet: the actor issue builds it on top of meshrl.rpc and the ActorService proto.
"""
