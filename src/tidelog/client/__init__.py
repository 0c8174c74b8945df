"""tidelog.client"""
