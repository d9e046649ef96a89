"""Offline agents on Dopamine's JAX agents."""
