"""The operator's side of devices and jobs: job files, node assignment, publishing a job, and
writing the trained model a job returns. Runs on a workstation; imports no web stack, and
TensorFlow only behind the optional ``.keras`` writer."""
