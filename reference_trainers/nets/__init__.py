"""Networks: the bodies (MLP, CNN, recurrent) and their hand-written MLP passes."""
