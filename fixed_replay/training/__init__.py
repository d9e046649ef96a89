"""Training offline agents: the runner and the plots of its logs."""
