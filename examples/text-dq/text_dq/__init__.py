"""text_dq: a Flower app whose devices upload their text to train a language model (dq-flower)."""
