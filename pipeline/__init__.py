"""The recipes that drive every package end to end (`kair demo`): they import data_gen, train,
eval and kair_runtime, and none of those imports them."""
