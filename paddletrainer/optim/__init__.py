"""What one optimizer step is made of: the loss (:mod:`.loss`), mixed precision (:mod:`.amp`), non-finite
gradients and the loss scale (:mod:`.overflow`), and the optimizer and LR schedules (:mod:`.optimization`)."""
