"""agentrl's training stack: buffer, advantages, losses, learner, SFT warm start, training loop.

Import the modules you need (`agentrl_trainers.learner`, `agentrl_trainers.loop`, ...): this
package imports nothing eagerly, so loading its CLI entry point does not load torch.
"""
