"""The conversion pipeline: any source into a compact store or Dopamine files.

Locally, in worker processes or on Ray; RL Unplugged's download converts as
it arrives.
"""
